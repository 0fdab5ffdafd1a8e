"""The gateway's HAProxy configuration and maps (docs/gateway.md): Debian's HAProxy in front
of every routed endpoint, one URL for all of them.

A request passes, in order:
1. `GET /health` is the gateway's own liveness, open to anyone; any other path but the
   OpenAI routes (`ROUTES`, `GET /v1/models`) is a 404;
2. its bearer key, hashed (SHA-256) and looked up in `keys.map`, names the client; no key or
   an unknown one is a 401;
3. `GET /v1/models` answers the routed models whose endpoint passes its health check and
   the client's key may use (`gateway.lua`, a service in HAProxy's own Lua, reading the
   `access.map` of step 5);
4. the body's `model` (`json_query`, not fooled by a "model" inside a message) picks the
   endpoint in `models.map`; none is a 400, an unknown one a 404; an alias stands for its
   endpoint's model name from here on (`names.map`), for the limits and the counts;
5. from here on its use of the model is counted (the stick table `usage`: requests, 4xx
   and 5xx answers by `client/model`; and in the Lua state, the answers of the endpoint and
   their milliseconds to its response headers); a client limited to some models
   (`access.map`) gets a 403 for the others;
6. its limits, counted in the stick table `clients` (requests in the last minute, requests
   at once) give a 429 with Retry-After; at a reload the old workers hand the table to the
   new ones (the `peers` section of the local peer alone), so a reload keeps the counts;
7. the endpoint's backend: a 503 with Retry-After while no server of it passes its health
   check; otherwise the request goes on, with the endpoint's own key in place of the client's.

Every refusal is OpenAI's error object. Where `metrics_listen` is given, a second frontend
serves HAProxy's Prometheus exporter (`/metrics`: requests, answers by class and times per
endpoint's backend) and the `usage` table as JSON (`/usage`, read by epycd's /metrics).

Every write goes out at once (`option http-no-delay`): HAProxy's default lets the kernel
hold a small write, such as one streamed token, to fill a segment, which delayed the first
token by about 200 ms (benchmarks/gateway-results.md). The body is buffered whole for step
4, up to `BODY_LIMIT`: a larger one is a 413, its length said or chunked alike (headers over
`HEADER_LIMIT`, which would leave the buffer too little room to tell, are a 431). The log
names the client, never its key. Files are rendered here from the routes and keys; writing
them and reloading HAProxy is the caller's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from epycd.gateway import values
from epycd.gateway.keys import KeyStore
from epycd.gateway.routes import Route
from epycd.gateway.values import checked

ROUTES = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/rerank",
    "/v1/score",
)
"""The OpenAI POST routes routed by the body's model (vLLM's and llama-server's paths)."""
BODY_LIMIT = 1 << 20
"""The largest request body the gateway routes: a prompt of a quarter of a million tokens
or so. HAProxy holds a body this size in its buffer (`tune.bufsize`, below)."""
HEADER_LIMIT = 32 << 10
"""The most a request's headers may take (a 431 over it). Without it a client could fill
the buffer with headers, leaving less than `BODY_LIMIT` for the body, and a chunked body,
whose size is known only as it is received, would pass in part, the rest streamed behind."""
BUFFER_SIZE = BODY_LIMIT + (64 << 10)
"""The body, its headers and HAProxy's rewrite reserve (`tune.maxrewrite`): headers within
`HEADER_LIMIT` leave room for more than `BODY_LIMIT` of body, so a body over the limit,
chunked or not, always shows in the buffer as over it."""
MAX_CONNECTIONS = 1024
"""Each connection may hold a buffer of `BUFFER_SIZE` while a body arrives: a bound of about
1 GiB at once."""
CHECK_INTERVAL = "2s"
CHECK_INTERVAL_DOWN = "500ms"
"""An endpoint that is down (starting, or just approved) is checked more often, so that it
is routed within half a second of passing its health check."""
TIMEOUT_CONNECT = "5s"
TIMEOUT_STREAM = "1h"
"""A long generation streams for minutes; HAProxy must not cut it."""
TIMEOUT_BODY = "60s"
"""A client has this long to send its headers and body."""
RATE_WINDOW = "1m"
PEER_RESYNC_S = 5
"""HAProxy's own wait, fixed, at a start for an older process to hand its tables over."""
PEERS = "handover"
LOCAL_PEER = "epyc-llm-gateway"
"""The local peer's name, set in the configuration (`localpeer`), not the host's name
HAProxy takes by default: a renamed host would otherwise have no local peer."""
PEER_SOCKET = "unix@${RUNTIME_DIRECTORY-/tmp}/peers.sock"
"""Where the new workers take the `clients` table from the old ones at a reload: a socket in
the unit's own folder (`RuntimeDirectory=`, its user's alone), so no other process can
read or change a count, and no port is taken. A unit approved before it had that folder
reloads into its private /tmp (`PrivateTmp=yes`), as private, until `gateway approve`."""
USAGE_KEY_LENGTH = 64 + 1 + 200
"""`client/model`: a client's name, a slash and a routed model name (epycd.gateway.keys)."""
USAGE_EXPIRE = "7d"
"""A pair unused this long leaves the table (its counters restart if it comes back)."""
RETRY_AFTER_RATE_S = 60
RETRY_AFTER_CONCURRENCY_S = 1
RETRY_AFTER_DOWN_S = 10
LOG_FORMAT = (
    '"%ci:%cp [%tr] %ft %b/%s %TR/%Tw/%Tc/%Tr/%Ta %ST %B %tsc %ac/%fc/%bc/%sc/%rc %sq/%bq '
    'client=%[var(txn.client)] %{+Q}r"'
)
"""HAProxy's HTTP log line with the client's name added (never a header: the key)."""


@dataclass(frozen=True)
class GatewayFiles:
    """The files HAProxy reads, by name, for the folder they are rendered for, and the
    endpoints' own keys (a secret: written apart, root only, and read as a credential)."""

    config: str
    maps: dict[str, str]
    lua: str
    endpoint_keys: str

    def files(self) -> dict[str, str]:
        return {
            "haproxy.cfg": self.config,
            LUA_FILE: self.lua,
            **{f"{name}.map": text for name, text in self.maps.items()},
        }


@dataclass(frozen=True)
class ErrorAnswer:
    """A refusal the gateway answers itself, as OpenAI's error object."""

    status: int
    code: str
    message: str
    kind: str = "invalid_request_error"
    retry_after: int | None = None

    def body(self) -> str:
        """The JSON, without a quote or a backslash: it sits in a single-quoted string."""
        error = {"message": self.message, "type": self.kind, "param": None, "code": self.code}
        text = json.dumps({"error": error}, separators=(",", ":"))
        assert "'" not in text and "\\" not in text, text
        return text

    def error_rule(self) -> str:
        """`http-error`: this answer in place of HAProxy's own HTML page of its status."""
        header = f" hdr Retry-After {self.retry_after}" if self.retry_after is not None else ""
        return (
            f"    http-error status {self.status} content-type application/json "
            f"string '{self.body()}'{header}"
        )

    def rule(self, condition: str) -> str:
        """`http-request return` of this answer `condition` (`if ...`, `unless ...`)."""
        header = f" hdr Retry-After {self.retry_after}" if self.retry_after is not None else ""
        return (
            f"    http-request return status {self.status} content-type application/json"
            f"{header} string '{self.body()}' {condition}"
        )


UNKNOWN_URL = ErrorAnswer(404, "unknown_url", "no such route")
NO_KEY = ErrorAnswer(401, "invalid_api_key", "no valid API key: send Authorization: Bearer KEY")
TOO_LARGE = ErrorAnswer(
    413, "request_too_large", f"the body is over {BODY_LIMIT} bytes, the most the gateway routes"
)
HEADERS_TOO_LARGE = ErrorAnswer(
    431,
    "headers_too_large",
    f"the headers are over {HEADER_LIMIT} bytes, the most the gateway takes",
)
NO_MODEL = ErrorAnswer(400, "missing_model", "the body names no model")
UNKNOWN_MODEL = ErrorAnswer(
    404, "model_not_found", "no endpoint serves this model: GET /v1/models lists them"
)
NOT_ALLOWED = ErrorAnswer(403, "model_not_allowed", "this key may not use this model")
OVER_RPM = ErrorAnswer(
    429, "rate_limit_exceeded", "this key is over its requests per minute", "requests",
    RETRY_AFTER_RATE_S,
)  # fmt: skip
OVER_CONCURRENCY = ErrorAnswer(
    429, "rate_limit_exceeded", "this key has as many requests running as it may", "requests",
    RETRY_AFTER_CONCURRENCY_S,
)  # fmt: skip


HAPROXY_ERRORS = (
    ErrorAnswer(502, "bad_gateway", "the endpoint answered with an invalid response",
                "server_error"),
    ErrorAnswer(503, "endpoint_unavailable", "the endpoint could not be reached: try again "
                "later", "server_error", RETRY_AFTER_DOWN_S),
    ErrorAnswer(504, "endpoint_timeout", "the endpoint did not answer in time", "server_error"),
)  # fmt: skip
"""HAProxy's own errors (a connection refused after the last retry, a timeout), in OpenAI's
error object like every other refusal."""


def endpoint_down(endpoint: str) -> ErrorAnswer:
    endpoint = checked(values.ENDPOINT, endpoint)
    return ErrorAnswer(503, "endpoint_unavailable", f"endpoint {endpoint} is not ready: try "
                       "again later", "server_error", RETRY_AFTER_DOWN_S)  # fmt: skip


def map_text(pairs: Mapping[str, object], key_rule: values.Rule, value_rule: values.Rule) -> str:
    """HAProxy's map: `KEY VALUE` lines, each key and value checked by its anchored rule
    (epycd.gateway.values), so none holds white space."""
    lines = []
    for key, value in sorted(pairs.items()):
        lines.append(f"{checked(key_rule, key)} {checked(value_rule, value)}")
    return "".join(f"{line}\n" for line in lines)


def gateway_maps(routes: list[Route], store: KeyStore) -> dict[str, str]:
    """keys.map: digest -> client; models.map: model or alias -> backend; names.map: model
    or alias -> the model's name; access.map: `client/model` -> 1 for a client limited to
    models, `client/*` -> 1 for one that is not; rpm.map and concurrency.map: client -> its
    limit."""
    access: dict[str, int] = {}
    for client in store.keys:
        for model in client.models if client.models is not None else ["*"]:
            access[f"{client.name}/{model}"] = 1
    return {
        "keys": map_text(
            {client.sha256: client.name for client in store.keys}, values.DIGEST, values.CLIENT
        ),
        "models": map_text(
            {name: r.backend for r in routes for name in r.names}, values.MODEL, values.BACKEND
        ),
        "names": map_text(
            {name: r.model for r in routes for name in r.names}, values.MODEL, values.MODEL
        ),
        "access": map_text(access, values.ACCESS, values.LIMIT),
        "rpm": map_text(
            {c.name: c.rpm for c in store.keys if c.rpm is not None}, values.CLIENT, values.LIMIT
        ),
        "concurrency": map_text(
            {c.name: c.concurrency for c in store.keys if c.concurrency is not None},
            values.CLIENT,
            values.LIMIT,
        ),
    }


LUA_FILE = "gateway.lua"
GATEWAY_LUA = """-- epyc-llm gateway: GET /v1/models, the routed models whose endpoint is up now and
-- the client's key may use; GET /usage, the use of each model by each client since HAProxy
-- started.
-- Written by epycd (epycd/gateway/haproxy.py); HAProxy loads it at start and at each reload.
-- {name, backend, endpoint, model}: a name routed (a model's or an alias) and its model
local routes = {
%s}
-- what a client may use, the map the frontend checks each request by: client/model, or
-- client/* for every model
local access = Map.new("%s", Map._str)

local function allowed(client, model)
  return client ~= nil and (access:lookup(client .. "/*") ~= nil
    or access:lookup(client .. "/" .. model) ~= nil)
end

local function send_json(applet, body)
  applet:set_status(200)
  applet:add_header("content-type", "application/json")
  applet:add_header("content-length", string.len(body))
  applet:start_response()
  applet:send(body)
end

core.register_service("epyc_models", "http", function(applet)
  local data = {}
  local client = applet:get_var("txn.client")
  for _, route in ipairs(routes) do
    local backend = core.backends[route[2]]
    local up = false
    if backend ~= nil and allowed(client, route[4]) then
      for _, server in pairs(backend.servers) do
        local status = server:get_stats()["status"]
        -- "no check": an on-demand endpoint, never checked (its socket starts it)
        if status ~= nil and (string.sub(status, 1, 2) == "UP" or status == "no check") then
          up = true
        end
      end
    end
    if up then
      table.insert(data, string.format(
        '{"id":"%%s","object":"model","owned_by":"epyc-llm","endpoint":"%%s"}',
        route[1], route[3]))
    end
  end
  send_json(applet, '{"object":"list","data":[' .. table.concat(data, ",") .. ']}')
end)

-- each client/model's answered requests and their milliseconds to the endpoint's
-- response headers (a stream's first byte), since HAProxy started: one state for all threads
local answered = {}

local function now_ms()
  local now = core.now()
  return now.sec * 1000 + math.floor(now.usec / 1000)
end

core.register_action("epyc_started", {"http-req"}, function(txn)
  txn:set_var("txn.started_ms", now_ms())
end)

core.register_action("epyc_answered", {"http-res"}, function(txn)
  local key, started = txn:get_var("txn.wanted"), txn:get_var("txn.started_ms")
  if key == nil or started == nil then
    return
  end
  local entry = answered[key] or {0, 0}
  entry[1] = entry[1] + 1
  entry[2] = entry[2] + math.max(now_ms() - started, 0)
  answered[key] = entry
end)

core.register_service("epyc_usage", "http", function(applet)
  local rows = {}
  local usage = core.backends["usage"]
  if usage ~= nil and usage.stktable ~= nil then
    for key, counters in pairs(usage.stktable:dump()) do
      local entry = answered[key] or {0, 0}
      table.insert(rows, string.format(
        '{"key":"%%s","requests":%%d,"client_errors":%%d,"server_errors":%%d,' ..
        '"answered":%%d,"answer_ms":%%d}', key,
        counters["http_req_cnt"] or 0, counters["gpc0"] or 0, counters["gpc1"] or 0,
        entry[1], entry[2]))
    end
  end
  send_json(applet, '{"usage":[' .. table.concat(rows, ",") .. ']}')
end)
"""


def gateway_lua(routes: list[Route], access_map: Path) -> str:
    """`GET /v1/models`: OpenAI's list of the routed models whose backend has a server up
    (HAProxy's health check of the endpoint; an on-demand endpoint's, never checked, always)
    and the client's key may use (`access_map`, as for a request), built per request by
    HAProxy's Lua; and
    `GET /usage` on the metrics frontend, the `usage` table's counters. The names are
    routable names (`MODEL_NAME`, `CLIENT_NAME`: no quote or backslash), safe in Lua and
    JSON strings."""
    rows = []
    for route in routes:
        for name in route.names:
            fields = (
                checked(values.MODEL, name),
                checked(values.BACKEND, route.backend),
                checked(values.ENDPOINT, route.endpoint),
                checked(values.MODEL, route.model),
            )
            rows.append("  {" + ", ".join(f'"{f}"' for f in fields) + "},\n")
    return GATEWAY_LUA % ("".join(rows), checked(values.PATH, access_map))


USAGE = 1
"""The stick counter that tracks the request in the `usage` table: its requests count
themselves (`http_req_cnt`); its answers of 4xx and 5xx are counted in `gpc0` and `gpc1`,
by the rules here, since HAProxy's own error counters leave out the answers it makes
itself."""


def counted(answer: ErrorAnswer, condition: str) -> list[str]:
    """`answer` under `condition`, counted in the usage table first."""
    counter = "gpc0" if answer.status < 500 else "gpc1"
    return [f"    http-request sc-inc-{counter}({USAGE}) {condition}", answer.rule(condition)]


def _frontend(listen: str, folder: Path, tls_cert: str | None) -> list[str]:
    def path(name: str) -> str:
        return checked(values.PATH, folder / name)

    bind = f"    bind {checked(values.ADDRESS, listen)}"
    if tls_cert is not None:
        bind += f' ssl crt "{checked(values.PATH, tls_cert)}" alpn h2,http/1.1'
    digest = "req.hdr(authorization),word(2,' '),sha2(256),hex,lower"
    return [
        "frontend gateway",
        bind,
        "    option http-buffer-request",
        f"    timeout http-request {TIMEOUT_BODY}",
        f"    log-format {LOG_FORMAT}",
        f"    acl route path {' '.join(ROUTES)}",
        "    acl models path /v1/models",
        "    http-request return status 200 content-type text/plain string ok"
        " if { path /health } METH_GET",
        UNKNOWN_URL.rule("unless route METH_POST or models METH_GET"),
        f"    http-request set-var(txn.client) {digest},map({path('keys.map')})",
        NO_KEY.rule("unless { var(txn.client) -m found }"),
        "    http-request del-header Authorization",
        "    http-request use-service lua.epyc_models if models",
        HEADERS_TOO_LARGE.rule(f"if {{ req.hdrs,length gt {HEADER_LIMIT} }}"),
        # one rule for every framing: the length said (Content-Length), or the chunks or
        # HTTP/2 frames received, which `option http-buffer-request` waited for
        TOO_LARGE.rule(f"if {{ req.body_size gt {BODY_LIMIT} }}"),
        "    http-request set-var(txn.model) req.body,json_query('$.model')",
        NO_MODEL.rule("unless { var(txn.model) -m found }"),
        f"    http-request set-var(txn.backend) var(txn.model),map({path('models.map')})",
        UNKNOWN_MODEL.rule("unless { var(txn.backend) -m found }"),
        f"    http-request set-var(txn.model) var(txn.model),map({path('names.map')})",
        "    http-request set-var(txn.wanted) var(txn.client),concat(/,txn.model,)",
        f"    http-request track-sc{USAGE} var(txn.wanted) table usage",
        "    http-request lua.epyc_started",
        "    http-request set-var(txn.any) var(txn.client),concat(/*)",
        f"    acl allowed var(txn.wanted),map({path('access.map')}) -m found",
        f"    acl allowed var(txn.any),map({path('access.map')}) -m found",
        *counted(NOT_ALLOWED, "unless allowed"),
        "    http-request track-sc0 var(txn.client) table clients",
        f"    http-request set-var(txn.rpm) var(txn.client),map_str_int({path('rpm.map')},0)",
        "    http-request set-var(txn.concurrency) "
        f"var(txn.client),map_str_int({path('concurrency.map')},0)",
        "    acl rpm_limited var(txn.rpm) -m int gt 0",
        "    acl over_rpm sc_http_req_rate(0),sub(txn.rpm) gt 0",
        "    acl concurrency_limited var(txn.concurrency) -m int gt 0",
        "    acl over_concurrency sc_trackers(0),sub(txn.concurrency) gt 0",
        *counted(OVER_RPM, "if rpm_limited over_rpm"),
        *counted(OVER_CONCURRENCY, "if concurrency_limited over_concurrency"),
        "    use_backend %[var(txn.backend)]",
        f"    http-response sc-inc-gpc0({USAGE}) if {{ status 400:499 }}",
        f"    http-response sc-inc-gpc1({USAGE}) if {{ status 500:599 }}",
        "    http-response lua.epyc_answered",
    ]


def _backend(route: Route, endpoint_keys_path: str | None) -> list[str]:
    """An endpoint's backend: checked, and a 503 while it is down; an on-demand endpoint's
    is never checked (a check would start its engine, docs/on-demand.md): its socket takes
    the request and holds it while the engine starts."""
    lines = [f"backend {checked(values.BACKEND, route.backend)}"]
    if not route.on_demand:
        lines += [
            "    option httpchk GET /health",
            "    http-check expect status 200",
            *counted(endpoint_down(route.endpoint), "if { nbsrv lt 1 }"),
        ]
    if endpoint_keys_path is not None:
        key = f"%[be_name,map({checked(values.PATH, endpoint_keys_path)})]"
        lines.append(f'    http-request set-header Authorization "Bearer {key}"')
    address = checked(values.ADDRESS, route.address)
    if route.on_demand:
        lines.append(f"    server endpoint {address}")
        return lines
    lines.append(
        f"    server endpoint {address} check inter {CHECK_INTERVAL} "
        f"downinter {CHECK_INTERVAL_DOWN} fall 2 rise 1"
        " observe layer4 error-limit 1 on-error mark-down"
    )
    return lines


def _handover() -> list[str]:
    """A peers section of the local peer alone: at a reload the old workers hand the
    limits' counts (`clients`) to the new ones, so a reload never resets a key's limits."""
    return [f"peers {PEERS}", f'    bind "{PEER_SOCKET}"', f"    server {LOCAL_PEER}"]


def _metrics_frontend(listen: str) -> list[str]:
    """HAProxy's Prometheus exporter and the usage table, for this host's scrapers only:
    no key is asked, so it belongs on loopback (the default)."""
    return [
        "frontend metrics",
        f"    bind {checked(values.ADDRESS, listen)}",
        "    no log",
        "    http-request use-service prometheus-exporter if { path /metrics } METH_GET",
        "    http-request use-service lua.epyc_usage if { path /usage } METH_GET",
        UNKNOWN_URL.rule("if TRUE"),
    ]


def gateway_files(
    routes: list[Route],
    store: KeyStore,
    *,
    listen: str,
    metrics_listen: str,
    folder: Path,
    endpoint_keys: Mapping[str, str],
    endpoint_keys_path: str,
    tls_cert: str | None = None,
) -> GatewayFiles:
    """Everything HAProxy reads, for `folder` (the absolute folder the files are written
    to): the gateway on `listen` (`ADDRESS:PORT`), with TLS from `tls_cert` where given,
    its metrics on `metrics_listen` ("" for none),
    and the endpoints' own keys (`endpoint_keys`, by endpoint name) at `endpoint_keys_path`
    (both paths as HAProxy opens them: a credential's, epycd.gateway.unit)."""
    lines = [
        "global",
        "    log stdout format raw local0",
        f"    localpeer {LOCAL_PEER}",
        f"    lua-load {checked(values.PATH, folder / LUA_FILE)}",
        f"    maxconn {MAX_CONNECTIONS}",
        f"    tune.bufsize {BUFFER_SIZE}",
        "defaults",
        "    mode http",
        "    log global",
        f"    timeout connect {TIMEOUT_CONNECT}",
        f"    timeout client {TIMEOUT_STREAM}",
        f"    timeout server {TIMEOUT_STREAM}",
        "    option redispatch 1",
        "    option http-no-delay",
        *(answer.error_rule() for answer in HAPROXY_ERRORS),
        *_frontend(listen, folder, tls_cert),
        *_handover(),
        "backend clients",
        "    stick-table type string len 64 size 100k expire 2m "
        f"store http_req_rate({RATE_WINDOW}) peers {PEERS}",
        "backend usage",
        f"    stick-table type string len {USAGE_KEY_LENGTH} size 100k expire {USAGE_EXPIRE} "
        "store http_req_cnt,gpc0,gpc1",
    ]
    if metrics_listen:
        lines += _metrics_frontend(metrics_listen)
    for route in routes:
        keyed = route.endpoint in endpoint_keys
        lines += _backend(route, endpoint_keys_path if keyed else None)
    keys = {r.backend: endpoint_keys[r.endpoint] for r in routes if r.endpoint in endpoint_keys}
    return GatewayFiles(
        config="\n".join(lines) + "\n",
        maps=gateway_maps(routes, store),
        lua=gateway_lua(routes, folder / "access.map"),
        endpoint_keys=map_text(keys, values.BACKEND, values.SECRET),
    )
