"""The one HTTP transport to the Kubernetes API server, shared by the operator's client (`Kube`, from
threads), its watch-fed caches (`HttpSource`) and the quota webhook (`QuotaApi`, both on an event loop).

Credentials come from a kubeconfig, else the in-cluster service account, through the official client's
loader (it knows every kubeconfig auth flavour). The Authorization header is worked out for every
request, never once at start-up: the kubelet rewrites a pod's projected service-account token about
hourly, and a kubeconfig's exec or OIDC token expires, so a header read once would go stale.

`ApiTransport` holds the connection pools (urllib3 through the official client for blocking callers,
aiohttp for callers on an event loop), the TLS context, the timeout and how often a 429 is retried.
It answers with the status and body; what a status means (404 as "none", 409 as a conflict) is the
caller's.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import orjson

if TYPE_CHECKING:  # imported where used: the CLI's synchronous requests need not load it (0.3 s)
    import aiohttp

Obj = dict[str, Any]

POOL_SIZE = 64  # the upgrade engine writes to many nodes side by side; the webhook answers many at once
RETRY_AFTER_CAP = 5.0  # seconds: the most a 429's Retry-After is waited before the next attempt


class ApiError(Exception):
    """An answer of the API server with an HTTP error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


def selectors(label_selector: str | None, field_selector: str | None) -> dict[str, str]:
    """The query parameters of a label and a field selector, where given."""
    params = {}
    if label_selector:
        params["labelSelector"] = label_selector
    if field_selector:
        params["fieldSelector"] = field_selector
    return params


def error_message(text: str) -> str:
    """The message of a Status the API server answered with, else the start of the body."""
    try:
        return str(orjson.loads(text).get("message", text))
    except (ValueError, AttributeError):
        return text[:500]


class TokenFile:
    """A bearer token kept in a file that is rewritten in place of the old one (a projected
    service-account token: the kubelet swaps the file about hourly). The file is looked at on every
    read and read again whenever it changed; an unchanged file costs one stat()."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int] | None = None  # (inode, size, mtime) of what was read
        self._token = ""

    def read(self) -> str:
        stat = os.stat(self.path)  # follows the kubelet's ..data symlink to the current file
        seen = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        with self._lock:
            if seen != self._seen:
                self._token = self.path.read_text().strip()
                self._seen = seen
            return self._token


@dataclass(frozen=True)
class Credentials:
    """Where the API server is and how to prove who we are to it."""

    server: str
    ssl_context: ssl.SSLContext | bool
    headers: Mapping[str, str]  # sent as they are (a kubeconfig's fixed token)
    # Worked out again for every request, replacing `headers`' Authorization: the in-cluster token
    # file, or a kubeconfig whose token the official loader refreshes.
    authorize: Callable[[], str] | None = None
    # The official client's configuration it came from (file paths for kopf, proxy, TLS server name).
    configuration: Any = field(default=None, compare=False)

    def authorization(self) -> Mapping[str, str]:
        """The headers that authenticate one request, as of now."""
        if self.authorize is None:
            return self.headers
        header = self.authorize()
        return {**self.headers, "Authorization": header} if header else self.headers


def authorization_header(configuration: Any) -> str:
    """The Authorization value of a loaded client configuration, with exactly one scheme.

    A kubeconfig token arrives bare under `authorization` (its scheme, if any, in `api_key_prefix`); the
    in-cluster loader stores the service-account token as "bearer <token>" under `BearerToken`. The
    scheme is matched without regard to case, as the API server does."""
    for key in ("authorization", "BearerToken"):
        value = str(configuration.api_key.get(key) or "").strip()
        if not value:
            continue
        scheme, _, rest = value.partition(" ")
        if rest and scheme.lower() == "bearer":
            return f"Bearer {rest.strip()}"
        if rest:  # another scheme (Basic, ...): as configured
            return value
        return f"{configuration.api_key_prefix.get(key) or 'Bearer'} {value}"
    return ""


def load_credentials(kubeconfig: Path | str | None = None, context: str | None = None) -> Credentials:
    """`kubeconfig`, else $KUBECONFIG / ~/.kube/config, else the in-cluster service account."""
    from kubernetes import client, config
    from kubernetes.config import incluster_config

    configuration = client.Configuration()
    configuration.connection_pool_maxsize = POOL_SIZE
    token: TokenFile | None = None
    try:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig) if kubeconfig else None,
            context=context,
            client_configuration=configuration,
        )
    except (config.ConfigException, FileNotFoundError, TypeError):
        if kubeconfig:
            raise
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        token = TokenFile(Path(incluster_config.SERVICE_TOKEN_FILENAME))
    ssl_context: ssl.SSLContext | bool = False
    if configuration.verify_ssl:
        ssl_context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
        if configuration.cert_file:
            ssl_context.load_cert_chain(configuration.cert_file, configuration.key_file)

    def authorize() -> str:
        if token is not None:
            return f"Bearer {token.read()}"
        refresh = configuration.refresh_api_key_hook  # an expiring exec / OIDC token is fetched again
        if refresh is not None:
            refresh(configuration)
        return authorization_header(configuration)

    return Credentials(str(configuration.host), ssl_context, {}, authorize, configuration)


# What a kubeconfig's cluster and user may hold for `read_plain_kubeconfig`; anything else (exec,
# auth-provider, tokenFile, a proxy, a TLS server name, ...) is left to the official loader.
PLAIN_CLUSTER_KEYS = frozenset(
    {"server", "certificate-authority", "certificate-authority-data", "insecure-skip-tls-verify"}
)
PLAIN_USER_KEYS = frozenset(
    {"client-certificate", "client-certificate-data", "client-key", "client-key-data", "token"}
)


def _named(document: Mapping[str, Any], section: str, name: object) -> Mapping[str, Any] | None:
    """The entry called `name` of a kubeconfig's clusters, users or contexts."""
    inner = section[:-1]  # clusters -> cluster
    for entry in document.get(section) or []:
        if isinstance(entry, Mapping) and entry.get("name") == name and isinstance(entry.get(inner), Mapping):
            value: Mapping[str, Any] = entry[inner]
            return value
    return None


def _pem(entry: Mapping[str, Any], key: str, base: Path) -> bytes | None:
    """A kubeconfig's PEM: `<key>-data` (base64) or the file `<key>` (relative to the kubeconfig)."""
    import base64

    if entry.get(f"{key}-data"):
        return base64.b64decode(entry[f"{key}-data"])
    if entry.get(key):
        return (base / str(entry[key])).expanduser().read_bytes()
    return None


def read_plain_kubeconfig(
    kubeconfig: Path | str | None = None, context: str | None = None
) -> Credentials | None:
    """The credentials of a kubeconfig whose user is a client certificate or a fixed token, read without
    the official client (importing it takes half a second, more than a short command's work); None
    where the kubeconfig is missing, is several files or needs more than that (the official loader's
    case)."""
    if kubeconfig:
        path = Path(kubeconfig)
    else:
        listed = os.environ.get("KUBECONFIG", "")
        if os.pathsep in listed.strip(os.pathsep):
            return None  # several files, merged by the official loader
        path = Path(listed.strip(os.pathsep) or "~/.kube/config").expanduser()
    try:
        text = path.read_text()
    except OSError:
        return None
    import yaml

    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    if not isinstance(document, Mapping):
        return None
    chosen = _named(document, "contexts", context or document.get("current-context"))
    if chosen is None:
        return None
    cluster = _named(document, "clusters", chosen.get("cluster"))
    user = _named(document, "users", chosen.get("user")) if chosen.get("user") else {}
    if (
        cluster is None
        or user is None
        or not isinstance(cluster.get("server"), str)
        or not set(cluster) <= PLAIN_CLUSTER_KEYS
        or not set(user) <= PLAIN_USER_KEYS
    ):
        return None
    base = path.parent
    ssl_context: ssl.SSLContext | bool = False
    if not cluster.get("insecure-skip-tls-verify"):
        authority = _pem(cluster, "certificate-authority", base)
        ssl_context = ssl.create_default_context(cadata=authority.decode() if authority else None)
        certificate, key = _pem(user, "client-certificate", base), _pem(user, "client-key", base)
        if certificate and key:
            # ssl loads a certificate chain from files only: a private directory, removed at once
            with tempfile.TemporaryDirectory(prefix="gpuforge-tls-") as tmp:
                (Path(tmp) / "tls.crt").write_bytes(certificate)
                (Path(tmp) / "tls.key").write_bytes(key)
                ssl_context.load_cert_chain(Path(tmp) / "tls.crt", Path(tmp) / "tls.key")
    token = str(user.get("token") or "").strip()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return Credentials(str(cluster["server"]).rstrip("/"), ssl_context, headers)


class ApiTransport:
    """Requests to one API server: pooled connections, TLS, a timeout and (if asked) 429 retries.

    `request` is for callers on an event loop (one aiohttp session, made on first use), `request_sync`
    for blocking callers (the official client's urllib3 pool). Neither raises on an error status."""

    def __init__(
        self,
        credentials: Credentials,
        *,
        timeout: float = 60.0,
        pool_size: int = POOL_SIZE,
        retries_on_429: int = 0,
    ) -> None:
        self.credentials = credentials
        self.timeout = timeout
        self.pool_size = pool_size
        # A 429 (API priority and fairness, or a resource whose storage is still initializing, e.g.
        # right after its CRD was created) is retried this often after the server's Retry-After, as
        # client-go does.
        self.retries_on_429 = retries_on_429
        self._session: aiohttp.ClientSession | None = None
        self._rest: Any = None
        self._rest_lock = threading.Lock()

    @classmethod
    def from_kubeconfig(
        cls,
        kubeconfig: Path | str | None = None,
        context: str | None = None,
        *,
        plain: bool = False,
        **options: Any,
    ) -> ApiTransport:
        """`plain`: a kubeconfig `read_plain_kubeconfig` can read is read without the official client,
        and blocking requests go through urllib3 alone (for short commands; such credentials have no
        official configuration for kopf)."""
        credentials = read_plain_kubeconfig(kubeconfig, context) if plain else None
        return cls(credentials or load_credentials(kubeconfig, context), **options)

    # --- on an event loop ----------------------------------------------------------------------------

    def session(self) -> aiohttp.ClientSession:
        import aiohttp

        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                base_url=self.credentials.server.rstrip("/") + "/",
                connector=aiohttp.TCPConnector(ssl=self.credentials.ssl_context, limit=self.pool_size),
                headers={"Accept": "application/json"},
                timeout=aiohttp.ClientTimeout(total=self.timeout),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, str]:
        """(status, body text) of one request; a 429 is retried `retries_on_429` times."""
        data = orjson.dumps(body) if body is not None else None
        headers = dict(self.credentials.authorization())
        if data is not None:
            headers["Content-Type"] = content_type
        for attempt in range(self.retries_on_429 + 1):
            async with self.session().request(
                method, path.lstrip("/"), data=data, params=params, headers=headers
            ) as response:
                text = await response.text()
                if response.status == 429 and attempt < self.retries_on_429:
                    retry_after = response.headers.get("Retry-After", "1")
                    delay = float(retry_after) if retry_after.isdigit() else 1.0
                    await asyncio.sleep(min(delay, RETRY_AFTER_CAP))
                    continue
                return response.status, text
        raise AssertionError("unreachable")

    async def watch(
        self,
        path: str,
        resource_version: str,
        label_selector: str | None = None,
        timeout_seconds: int = 300,
        field_selector: str | None = None,
    ) -> AsyncIterator[Obj]:
        """Watch events ({type, object}) of the collection at `path` from `resource_version`, with
        bookmarks, until the server ends the stream."""
        params = {
            **selectors(label_selector, field_selector),
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=None, sock_read=timeout_seconds + 30)
        async with self.session().get(
            path.lstrip("/"), params=params, headers=self.credentials.authorization(), timeout=timeout
        ) as response:
            if response.status >= 400:
                raise ApiError(response.status, error_message(await response.text()))
            # An event can be longer than aiohttp's line limit (64 KiB; a Node is tens of kB, a workload
            # with a large pod template or a quota with many reservations more): split the stream here.
            buffer = b""
            async for chunk in response.content.iter_any():
                *lines, buffer = (buffer + chunk).split(b"\n")
                for line in lines:
                    if line.strip():
                        yield orjson.loads(line)

    # --- blocking ----------------------------------------------------------------------------------

    def _rest_client(self) -> Any:
        with self._rest_lock:
            if self._rest is None and self.credentials.configuration is None:
                import urllib3

                context = self.credentials.ssl_context
                if isinstance(context, ssl.SSLContext):
                    self._rest = urllib3.PoolManager(maxsize=self.pool_size, ssl_context=context)
                else:
                    self._rest = urllib3.PoolManager(
                        maxsize=self.pool_size, cert_reqs=ssl.CERT_NONE, assert_hostname=False
                    )
            elif self._rest is None:
                from kubernetes import client

                configuration = self.credentials.configuration
                configuration.connection_pool_maxsize = self.pool_size
                self._rest = client.rest.RESTClientObject(configuration)
            return self._rest

    def request_sync(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        accept: str = "application/json",
    ) -> tuple[int, bytes]:
        """(status, body) of one request, from any thread."""
        url = self.credentials.server + path + (f"?{urlencode(query)}" if query else "")
        headers = {
            "Accept": accept,
            "Content-Type": content_type,
            **self.credentials.authorization(),
        }
        rest = self._rest_client()
        if self.credentials.configuration is not None:
            response = rest.request(method, url, headers=headers, body=body, _request_timeout=self.timeout)
            data: bytes = response.read()
            return response.status, data
        # urllib3 alone: the body is JSON (an apply patch's YAML is sent as JSON, as the official client does)
        encoded = body if body is None or isinstance(body, bytes | str) else orjson.dumps(body)
        # urllib3's default retries of a failed connection, as the official client's pool has
        answer = rest.request(method, url, headers=headers, body=encoded, timeout=self.timeout)
        return answer.status, bytes(answer.data)
