"""Tenants and their API keys: a registry of hashed keys, in the server's main store.

A key is ``ck_<key id>_<secret>``: the key id (12 hex digits) names the key in listings and
for revocation; the secret is 256 random bits. The registry keeps only the SHA-256 of the whole
key, and checks a presented key by looking its id up and comparing digests with
:func:`hmac.compare_digest`; the key itself is shown once, when it is created. A high-entropy
random key needs no slow password hash: nobody can guess a preimage of its digest.

A tenant is a name (lower-case letters, digits and ``_``, starting with a letter, at most 32
characters) that every key names; creating a key for a new name creates the tenant. The
registry lives where the tenants' data is described in :mod:`ctxkeep.server.tenants`:

==================  ===================================================================
store               keys
==================  ===================================================================
``memory://``       in this process (tests)
``sqlite:///f.db``  table ``ctxkeep_api_keys`` in ``f.db`` (tenants' files beside it)
``redis://``        hash ``{prefix}server:keys`` (tenants under ``{prefix}tenant:<name>:``)
``postgresql://``   table ``ctxkeep_api_keys`` in the URL's schema
==================  ===================================================================

On Redis the keys are exactly as durable as the Redis server makes them: on a server with
neither AOF nor RDB persistence (``--save "" --appendonly no``, as on the project's own
machines) a restart of Redis loses every key, and from then on every request of every tenant
answers 401 (223 of 223 did, issue 25), with the tenants' data gone as well. A
``maxmemory-policy`` of ``allkeys-*`` may evict the hash under memory pressure. So
:meth:`KeyRegistry.volatility` says why a store could lose its keys, and ``ctxkeep serve``
refuses to start on such a Redis unless told ``--allow-volatile-redis``.

A server trusts a key it has checked for :data:`KEY_CACHE_SECONDS` before reading it from the
store again (:meth:`KeyRegistry.cached`): the lookup was one statement of every request, over a
third of the statements of an append, and a thread hand-off before each route (issue 28). A key
revoked through the same registry (the process that answers the revoke) is refused at once;
one revoked by another process (``ctxkeep keys revoke``, another worker or host) is refused by
this one within :data:`KEY_CACHE_SECONDS`. A key that fails its check is never remembered, so a
key just created works at once everywhere.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlparse

from ctxkeep.errors import ConfigError

KEY_PREFIX = "ck_"
TENANT_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,31}")
_KEY_ID = re.compile(r"[0-9a-f]{12}")
KEY_CACHE_SECONDS = 2.0
"""How long a server process trusts a key it has checked (see the module docstring): at most
this long after ``ctxkeep keys revoke`` another process still serves the key."""


@dataclass(frozen=True, kw_only=True)
class ApiKey:
    """A key as the registry keeps it: never the key itself."""

    key_id: str
    """The key's public id (12 hex digits), the part after ``ck_``."""
    tenant: str
    """The tenant the key acts for."""
    digest: str
    """SHA-256 of the whole key, hex."""
    created_at: float
    """Unix time of creation."""
    revoked_at: float | None = None
    """Unix time of revocation; a revoked key is refused."""

    def public(self) -> dict[str, Any]:
        """What a listing shows (no digest)."""
        return {
            "key_id": self.key_id,
            "tenant": self.tenant,
            "created_at": self.created_at,
            "revoked_at": self.revoked_at,
        }


def check_tenant(name: Any) -> str:
    """``name`` if it is a valid tenant name.

    Raises:
        ConfigError: not a valid name.

    """
    if not isinstance(name, str) or not TENANT_PATTERN.fullmatch(name):
        raise ConfigError(
            f"invalid tenant name {name!r}: use 1-32 lower-case letters, digits and '_', "
            "starting with a letter"
        )
    return name


def digest(token: str) -> str:
    """SHA-256 of a key, hex."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_key(tenant: str, now: float) -> tuple[ApiKey, str]:
    """A fresh key for ``tenant``: its record and the key itself."""
    key_id = secrets.token_hex(6)
    token = f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
    return ApiKey(key_id=key_id, tenant=tenant, digest=digest(token), created_at=now), token


def key_id_of(token: str) -> str | None:
    """The key id a presented key names, or None if it is not shaped like a key."""
    if not token.startswith(KEY_PREFIX):
        return None
    key_id, sep, secret = token[len(KEY_PREFIX) :].partition("_")
    if not sep or not secret or not _KEY_ID.fullmatch(key_id):
        return None
    return key_id


class KeyRegistry(ABC):
    """Where keys are kept. All methods are thread-safe.

    With :attr:`cache_seconds` above 0 (the server sets it), :meth:`authenticate` remembers
    each key it passed, by the digest of the key (never the key itself), for that long, and
    :meth:`cached` answers from that memory without the store.
    """

    def __init__(self) -> None:
        self.cache_seconds = 0.0
        """How long a checked key is remembered (0: not at all)."""
        self._checked: dict[str, tuple[ApiKey, float]] = {}
        """Digest of a key that passed -> its record and the monotonic time it expires."""
        self._revocations = 0
        """Revocations through this registry: a check that began before one is not kept."""
        self._cache_lock = threading.Lock()

    def cached(self, token: str) -> ApiKey | None:
        """The live key ``token`` is, if :meth:`authenticate` passed it within the last
        :attr:`cache_seconds` and it was not revoked here since; else None (then ask
        :meth:`authenticate`). No I/O: a server calls it on its event loop.
        """
        if not self._checked:
            return None
        entry = self._checked.get(digest(token))
        if entry is None or entry[1] <= time.monotonic():
            return None
        return entry[0]

    def create(self, tenant: str) -> tuple[ApiKey, str]:
        """A new key for ``tenant`` (created if new): its record and the key, shown once.

        Raises:
            ConfigError: an invalid tenant name.

        """
        record, token = new_key(check_tenant(tenant), time.time())
        self._put(record)
        return record, token

    def authenticate(self, token: str) -> ApiKey | None:
        """The live key ``token`` is, or None (unknown, revoked, or not a key)."""
        key_id = key_id_of(token)
        if key_id is None:
            return None
        revocations = self._revocations
        record = self._get(key_id)
        if record is None or record.revoked_at is not None:
            return None
        hashed = digest(token)
        if not hmac.compare_digest(record.digest, hashed):
            return None
        if self.cache_seconds > 0:
            with self._cache_lock:
                if self._revocations == revocations:  # no revoke here raced the read
                    self._checked[hashed] = (record, time.monotonic() + self.cache_seconds)
        return record

    def revoke(self, key_id: str) -> bool:
        """Revoke a key; False if there is no live key with that id."""
        record = self._get(key_id) if _KEY_ID.fullmatch(key_id) else None
        if record is None or record.revoked_at is not None:
            return False
        self._put(replace(record, revoked_at=time.time()))
        with self._cache_lock:
            self._revocations += 1
            for hashed, (known, _) in list(self._checked.items()):
                if known.key_id == key_id:
                    del self._checked[hashed]
        return True

    def list_keys(self, tenant: str | None = None) -> list[ApiKey]:
        """Every key (of ``tenant``, if given), oldest first, revoked ones included."""
        keys = [k for k in self._all() if tenant is None or k.tenant == tenant]
        return sorted(keys, key=lambda k: (k.created_at, k.key_id))

    def tenants(self) -> list[str]:
        """Every tenant that has a key, sorted."""
        return sorted({k.tenant for k in self._all()})

    @abstractmethod
    def _put(self, record: ApiKey) -> None:
        """Store (or overwrite) a record."""

    @abstractmethod
    def _get(self, key_id: str) -> ApiKey | None:
        """The record of a key id."""

    @abstractmethod
    def _all(self) -> list[ApiKey]:
        """Every record."""

    def volatility(self) -> str | None:
        """Why the keys might not survive the store that holds them (a sentence naming the
        store), or None when they persist as the store's data does (a file, a database, this
        process for ``memory://``).
        """
        return None

    def close(self) -> None:  # noqa: B027 - optional
        """Release connections."""


def _encode(record: ApiKey) -> str:
    return json.dumps(asdict(record))


def _decode(text: str | bytes) -> ApiKey:
    return ApiKey(**json.loads(text))


class MemoryKeyRegistry(KeyRegistry):
    """Keys in this process (for ``memory://``)."""

    def __init__(self) -> None:
        super().__init__()
        self._keys: dict[str, ApiKey] = {}
        self._lock = threading.Lock()

    def _put(self, record: ApiKey) -> None:
        with self._lock:
            self._keys[record.key_id] = record

    def _get(self, key_id: str) -> ApiKey | None:
        with self._lock:
            return self._keys.get(key_id)

    def _all(self) -> list[ApiKey]:
        with self._lock:
            return list(self._keys.values())


_SQL_TABLE = (
    "CREATE TABLE IF NOT EXISTS ctxkeep_api_keys "
    "(key_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, record TEXT NOT NULL)"
)


class SQLiteKeyRegistry(KeyRegistry):
    """Keys in a table of the main SQLite file."""

    def __init__(self, path: str | Path) -> None:
        from ctxkeep._sqlite import SQLiteClient

        super().__init__()
        self.db = SQLiteClient(path, meta_key="server_keys", migrations=[_SQL_TABLE])

    def _put(self, record: ApiKey) -> None:
        with self.db.tx("store an API key") as conn:
            conn.execute(
                "INSERT INTO ctxkeep_api_keys (key_id, tenant, record) VALUES (?, ?, ?) "
                "ON CONFLICT (key_id) DO UPDATE SET record = excluded.record",
                (record.key_id, record.tenant, _encode(record)),
            )

    def _get(self, key_id: str) -> ApiKey | None:
        rows = self.db.q(
            "read an API key", "SELECT record FROM ctxkeep_api_keys WHERE key_id = ?", (key_id,)
        )
        return _decode(rows[0][0]) if rows else None

    def _all(self) -> list[ApiKey]:
        rows = self.db.q("list API keys", "SELECT record FROM ctxkeep_api_keys")
        return [_decode(r[0]) for r in rows]

    def close(self) -> None:
        """Close the file's connections."""
        self.db.close()


class PostgresKeyRegistry(KeyRegistry):
    """Keys in a table of the URL's schema; also creates the tenants' schemas.

    Lookups name the table with its schema and take a pooled connection under whatever
    ``search_path`` it holds: every request of the service looks its key up on the pool its
    tenant's stores share, and setting the registry's path and then the tenant's again cost
    two round trips a request.
    """

    def __init__(self, url: str) -> None:
        from ctxkeep._pg import PgClient

        super().__init__()
        self.db = PgClient(
            url, name="ctxkeep-server-keys", meta_key="server_keys", migrations=[_SQL_TABLE],
            max_size=4,
        )  # fmt: skip
        try:
            self.table = f"{self.db.schema()}.ctxkeep_api_keys"
        except BaseException:
            self.db.close()
            raise

    def _put(self, record: ApiKey) -> None:
        with self.db.tx("store an API key") as conn:
            conn.execute(
                "INSERT INTO ctxkeep_api_keys (key_id, tenant, record) VALUES (%s, %s, %s) "
                "ON CONFLICT (key_id) DO UPDATE SET record = excluded.record",
                (record.key_id, record.tenant, _encode(record)),
            )

    def _get(self, key_id: str) -> ApiKey | None:
        sql = f"SELECT record FROM {self.table} WHERE key_id = %s"
        rows = self.db.q("read an API key", sql, (key_id,), any_path=True)
        return _decode(rows[0][0]) if rows else None

    def _all(self) -> list[ApiKey]:
        rows = self.db.q("list API keys", f"SELECT record FROM {self.table}", any_path=True)
        return [_decode(r[0]) for r in rows]

    def create_schema(self, schema: str) -> None:
        """Create a tenant's schema if it does not exist (``schema`` is a checked name)."""
        with self.db.setup("create a tenant schema") as conn:
            conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')

    def extension_schema(self, extension: str, default: str) -> str:
        """The schema that holds ``extension``; if the database has it nowhere, it is created
        in schema ``default`` (both checked names). An extension lives in one schema of a
        database, so tenants' schemas cannot each hold their own.
        """
        find = (
            "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace "
            "WHERE e.extname = %s"
        )
        with self.db.setup(f"set up the {extension} extension") as conn:
            row = conn.execute(find, (extension,)).fetchone()
            if row is not None:
                return str(row[0])
            conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{default}"')
            conn.execute(f'CREATE EXTENSION IF NOT EXISTS "{extension}" SCHEMA "{default}"')
        return default

    def close(self) -> None:
        """Close the pool."""
        self.db.close()


class RedisKeyRegistry(KeyRegistry):
    """Keys in one hash under the URL's key prefix."""

    def __init__(self, url: str) -> None:
        from ctxkeep._redis import RedisClient

        super().__init__()
        self.client = RedisClient(url, meta_key="server_keys", migrations=[], params=("ttl_grace",))
        self.hash = f"{self.client.prefix}server:keys"

    def _put(self, record: ApiKey) -> None:
        with self.client.errors():
            self.client.conn.hset(self.hash, record.key_id, _encode(record))

    def _get(self, key_id: str) -> ApiKey | None:
        with self.client.errors():
            raw = cast("str | None", self.client.conn.hget(self.hash, key_id))
        return None if raw is None else _decode(raw)

    def _all(self) -> list[ApiKey]:
        with self.client.errors():
            raw = cast("dict[str, str]", self.client.conn.hgetall(self.hash))
        return [_decode(v) for v in raw.values()]

    def volatility(self) -> str | None:
        """Why this Redis could lose the keys (see :func:`redis_volatility`), or None.

        Its settings come from ``CONFIG GET``; where CONFIG is refused (renamed away, or denied
        by an ACL, as managed services do), from ``INFO``, which shows AOF and the eviction
        policy but not RDB snapshots.

        Raises:
            StorageError: the server cannot be reached.

        """
        from ctxkeep._redis import redis

        conn = self.client.conn
        with self.client.errors():
            try:
                pipe = conn.pipeline(transaction=False)
                for name in ("appendonly", "save", "maxmemory", "maxmemory-policy"):
                    pipe.config_get(name)
                settings: dict[str, str] = {}
                for answer in pipe.execute():
                    settings.update(answer)
                return self._named(redis_volatility(settings))
            except redis.ResponseError as exc:
                refused = f"CONFIG GET was refused ({exc})"
            try:
                info = {**conn.info("persistence"), **conn.info("memory")}
            except redis.ResponseError as exc:
                return self._named(f"could not be checked: {refused}, and INFO too ({exc})")
        known = {
            "appendonly": "yes" if info.get("aof_enabled") == 1 else "no",
            "maxmemory": str(info.get("maxmemory", 0)),
            "maxmemory-policy": str(info.get("maxmemory_policy", "noeviction")),
        }
        return self._named(redis_volatility(known, unknown_because=refused))

    def _named(self, problem: str | None) -> str | None:
        """``problem`` as a sentence that names the server and the hash of the keys."""
        if problem is None:
            return None
        where = f"the Redis at {self.client.where}"
        return f"{where}, which holds the API keys ({self.hash}), {problem}"

    def close(self) -> None:
        """Close the connection pool."""
        self.client.close()


def redis_volatility(settings: dict[str, str], *, unknown_because: str = "") -> str | None:
    """Why a Redis server with these settings could lose keys (what the server does, as
    ``has neither AOF ... nor RDB snapshots``), or None.

    Args:
        settings: ``appendonly``, ``save``, ``maxmemory`` and ``maxmemory-policy``, as
            ``CONFIG GET`` answers them; ``save`` absent: unknown.
        unknown_because: why ``save`` is unknown (said when it is what would decide).

    """
    reasons: list[str] = []
    if settings.get("appendonly") != "yes":
        save = settings.get("save")
        if save is None:
            reasons.append(
                f"could not be checked: {unknown_because}; AOF is off, and whether RDB "
                "snapshots are on cannot be seen without CONFIG"
            )
        elif not save.strip():
            reasons.append('has neither AOF (appendonly no) nor RDB snapshots (save "")')
    policy = settings.get("maxmemory-policy", "noeviction")
    if settings.get("maxmemory", "0") != "0" and policy.startswith("allkeys-"):
        reasons.append(f"evicts any key when memory runs short (maxmemory-policy {policy})")
    return " and ".join(reasons) or None


def open_key_registry(url: str) -> KeyRegistry:
    """The key registry of a storage URL (see the module docstring).

    Raises:
        ConfigError: an unsupported URL.
        StorageError: the store cannot be reached.

    """
    if url == "memory://":
        return MemoryKeyRegistry()
    scheme = urlparse(url).scheme
    if scheme == "sqlite":
        return SQLiteKeyRegistry(sqlite_path(url))
    if scheme in ("redis", "rediss", "unix"):
        return RedisKeyRegistry(url)
    if scheme in ("postgresql", "postgres"):
        return PostgresKeyRegistry(url)
    raise ConfigError(
        f"unsupported storage URL {url!r}; use memory://, sqlite:///path, redis://host:port/db "
        "or postgresql://..."
    )


def sqlite_path(url: str) -> str:
    """The file of a ``sqlite:///path`` URL.

    Raises:
        ConfigError: no path.

    """
    path = url[len("sqlite:///") :].split("?", 1)[0] if url.startswith("sqlite:///") else ""
    if not path:
        raise ConfigError(f"sqlite URL needs a path: sqlite:///path/to.db, got {url!r}")
    return path
