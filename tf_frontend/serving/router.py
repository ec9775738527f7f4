"""The front of ``xgr serve --replicas N``: TF Serving's gRPC and REST ports in front of N
serving processes (one per GPU), each request sent to the replica that owns its user key
(``affinity.ReplicaSet``: the one that holds the user's cached history), the least loaded
when that one is saturated, never a drained one.

The user key comes from the gRPC metadata or REST header ``x-user-key`` (the body is not
read: an ordinary L7 balancer in front of several hosts routes by the same header). Requests
pass through byte for byte, with their metadata; answers come back with their status and a
``x-replica`` entry naming who served them. A replica that gives no answer, or its own 5xx /
UNAVAILABLE, counts a fault; a request whose replica gave no answer at all is sent once more,
to another replica (a predict has no side effect). A health loop drains replicas whose
``/healthz`` fails and restores them when it answers again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
import urllib.request
from typing import Iterable

import grpc
import prometheus_client as prom
from aiohttp import ClientError, ClientSession, ClientTimeout, web

from tf_frontend.serving.affinity import NoReplica, Replica, ReplicaSet
from xgr_common.serving_names import USER_KEY_HEADER

LOG = logging.getLogger("xgr.serving")
REPLICA_HEADER = "x-replica"
# gRPC codes that are the replica's own fault (a client's mistakes are answers).
_FAULTS = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
# Headers a proxy must not copy (hop by hop, or recomputed).
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host",
        "content-encoding"}


class RouterMetrics:
    """router requests{replica,code}, fallbacks and drains per replica, in flight."""

    def __init__(self, replicas: ReplicaSet):
        self.registry = prom.CollectorRegistry()
        self._requests = prom.Counter("xgr_router_requests", "Requests forwarded, by replica "
                                      "and answer code.", ["replica", "code"],
                                      registry=self.registry)
        self._retries = prom.Counter("xgr_router_retries", "Requests sent again to another "
                                     "replica after no answer.", registry=self.registry)
        self._replicas = replicas
        self.registry.register(_ReplicaCollector(replicas))

    def answered(self, replica: str, code: str) -> None:
        self._requests.labels(replica, code).inc()

    def retried(self) -> None:
        self._retries.inc()


class _ReplicaCollector:
    def __init__(self, replicas: ReplicaSet):
        self._replicas = replicas

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        in_flight = GaugeMetricFamily("xgr_router_in_flight", "Requests at a replica now.",
                                      labels=["replica"])
        drained = GaugeMetricFamily("xgr_router_drained", "1 while a replica is drained.",
                                    labels=["replica"])
        fallbacks = CounterMetricFamily("xgr_router_fallbacks", "Requests of a replica's keys "
                                        "sent to the least loaded while it was saturated.",
                                        labels=["replica"])
        drains = CounterMetricFamily("xgr_router_drains", "Times a replica was drained.",
                                     labels=["replica"])
        for row in self._replicas.snapshot():
            in_flight.add_metric([row["name"]], row["in_flight"])
            drained.add_metric([row["name"]], float(row["drained"]))
            fallbacks.add_metric([row["name"]], row["fallbacks"])
            drains.add_metric([row["name"]], row["drains"])
        yield from (in_flight, drained, fallbacks, drains)


class Router:
    """The gRPC and REST front of a ``ReplicaSet``; ``start`` binds, ``stop`` closes."""

    def __init__(self, replicas: ReplicaSet, bind_address: str = "127.0.0.1",
                 grpc_port: int = 0, rest_port: int = 0, timeout_seconds: float = 60.0,
                 health_seconds: float = 1.0, workers: int = 32):
        self.replicas, self.metrics = replicas, RouterMetrics(replicas)
        self._bind, self._timeout = bind_address, timeout_seconds
        self._wanted = (grpc_port, rest_port)
        self._health_seconds, self._workers = health_seconds, workers
        self._channels = {r.name: grpc.insecure_channel(r.grpc_target)
                          for r in replicas.replicas.values()}
        self._stop = threading.Event()
        self.grpc_port = self.rest_port = 0
        self._grpc = None
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, name="router-rest",
                                             daemon=True)
        self._runner = None
        self._health = threading.Thread(target=self._health_loop, name="router-health",
                                        daemon=True)

    # ------------------------------------------------------------------------ life cycle
    def start(self) -> None:
        self._grpc = grpc.server(concurrent.futures.ThreadPoolExecutor(self._workers),
                                 handlers=[_GrpcProxy(self)])
        self.grpc_port = self._grpc.add_insecure_port(f"{self._bind}:{self._wanted[0]}")
        self._grpc.start()
        self._loop_thread.start()
        self.rest_port = asyncio.run_coroutine_threadsafe(self._start_rest(),
                                                          self._loop).result(30)
        self._health.start()

    def stop(self, grace_seconds: float = 10.0) -> None:
        self._stop.set()
        if self._grpc is not None:
            self._grpc.stop(grace_seconds).wait(grace_seconds + 1)
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(
                grace_seconds + 5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop_thread.join(5)
        for channel in self._channels.values():
            channel.close()

    # ---------------------------------------------------------------------------- gRPC
    def forward_grpc(self, method: str, request: bytes, context) -> bytes:
        metadata = tuple(context.invocation_metadata())
        key = dict(metadata).get(USER_KEY_HEADER)
        tried = set()
        for attempt in range(2):
            replica = self._pick(key, tried, context)
            call = self._channels[replica.name].unary_unary(method)
            timeout = context.time_remaining() if context.time_remaining() else self._timeout
            try:
                answer, rpc = call.with_call(request, timeout=timeout, metadata=metadata)
            except grpc.RpcError as error:
                code = error.code()
                no_answer = code == grpc.StatusCode.UNAVAILABLE and attempt == 0
                self.replicas.done(replica, fault=code in _FAULTS)
                self.metrics.answered(replica.name, code.name)
                if no_answer and len(self.replicas.replicas) > len(tried) + 1:
                    tried.add(replica.name)
                    self.metrics.retried()
                    continue
                context.set_trailing_metadata(((REPLICA_HEADER, replica.name),))
                context.abort(code, error.details() or code.name)
            self.replicas.done(replica, fault=False)
            self.metrics.answered(replica.name, "OK")
            context.set_trailing_metadata(tuple(rpc.trailing_metadata() or ())
                                          + ((REPLICA_HEADER, replica.name),))
            return answer
        raise AssertionError("unreachable")

    def _pick(self, key: str | None, tried: set[str], context=None) -> Replica:
        try:
            for _ in range(len(self.replicas.replicas) + 1):
                replica = self.replicas.choose(key.encode() if key else None)
                if replica.name not in tried:
                    return replica
                self.replicas.done(replica, fault=False)
                key = None   # its owner failed: the least loaded of the others
            raise NoReplica("no other replica to retry on")
        except NoReplica as error:
            if context is not None:
                context.abort(grpc.StatusCode.UNAVAILABLE, str(error))
            raise

    # ---------------------------------------------------------------------------- REST
    async def _start_rest(self) -> int:
        self._session = ClientSession(timeout=ClientTimeout(total=self._timeout))
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/monitoring/prometheus/metrics", self._metrics)
        app.router.add_route("*", "/{tail:.*}", self._forward_rest)
        app.on_cleanup.append(lambda _: self._session.close())
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._bind, self._wanted[1])
        await site.start()
        return site._server.sockets[0].getsockname()[1]

    async def _healthz(self, request: web.Request) -> web.Response:
        rows = self.replicas.snapshot()
        live = [r["name"] for r in rows if not r["drained"]]
        body = {"status": "SERVING" if live else "UNAVAILABLE", "replicas": rows}
        return web.json_response(body, status=200 if live else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=prom.generate_latest(self.metrics.registry),
                            headers={"Content-Type": prom.CONTENT_TYPE_LATEST})

    async def _forward_rest(self, request: web.Request) -> web.Response:
        body = await request.read()
        key = request.headers.get(USER_KEY_HEADER)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        tried = set()
        for attempt in range(2):
            try:
                replica = self._pick(key, tried)
            except NoReplica as error:
                return web.json_response({"error": str(error)}, status=503)
            try:
                async with self._session.request(request.method,
                                                 replica.rest_url + request.path_qs,
                                                 data=body, headers=headers) as answer:
                    payload = await answer.read()
                    status = answer.status
                    copied = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP}
            except (ClientError, asyncio.TimeoutError, OSError):
                self.replicas.done(replica, fault=True)
                self.metrics.answered(replica.name, "no_answer")
                if attempt == 0 and len(self.replicas.replicas) > 1:
                    tried.add(replica.name)
                    self.metrics.retried()
                    continue
                return web.json_response({"error": f"replica {replica.name} gave no answer"},
                                         status=502)
            self.replicas.done(replica, fault=status >= 500 and status != 503)
            self.metrics.answered(replica.name, str(status))
            copied[REPLICA_HEADER] = replica.name
            return web.Response(status=status, body=payload, headers=copied)
        raise AssertionError("unreachable")

    # -------------------------------------------------------------------------- health
    def _health_loop(self) -> None:
        while not self._stop.wait(self._health_seconds):
            for replica in list(self.replicas.replicas.values()):
                healthy = _healthy(replica.rest_url)
                drained = replica.drained(time.monotonic())
                if not healthy and not drained:
                    LOG.warning("replica failed its health check; drained",
                                extra={"replica": replica.name})
                    self.replicas.drain(replica.name)
                elif healthy and replica.drained_until and not drained:
                    self.replicas.restore(replica.name)


def _healthy(rest_url: str) -> bool:
    try:
        with urllib.request.urlopen(rest_url + "/healthz", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


class _GrpcProxy(grpc.GenericRpcHandler):
    """Every unary method (PredictionService, ModelService) passed through as bytes."""

    def __init__(self, router: Router):
        self._router = router

    def service(self, handler_call_details):
        method = handler_call_details.method

        def handle(request: bytes, context) -> bytes:
            return self._router.forward_grpc(method, request, context)
        return grpc.unary_unary_rpc_method_handler(handle)


def replicas_from(endpoints: Iterable[tuple[str, int, int]], host: str = "127.0.0.1"
                  ) -> list[Replica]:
    """Replicas of (name, gRPC port, REST port) on ``host``."""
    return [Replica(name, f"{host}:{grpc_port}", f"http://{host}:{rest_port}")
            for name, grpc_port, rest_port in endpoints]
