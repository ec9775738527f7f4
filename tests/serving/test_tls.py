"""TLS on both ports from TF Serving's SSLConfig text proto, with and without client
verification, driven by real clients (urllib over https, grpc's secure channel)."""

import json
import ssl
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from tf_frontend.serving.config import SSLConfig, parse_ssl_config
from tests.serving.helpers import columnar, history_reference, random_request, start_server
from xgr_common.errors import ConfigError

TLS = Path(__file__).resolve().parent / "tls"
REQUEST = random_request(np.random.default_rng(60), rows=2)


def _pem(name: str) -> str:
    return (TLS / name).read_text()


def _config_text(client_verify: bool) -> str:
    """An SSLConfig file as TF Serving's docs write one: escaped newlines in one field,
    a string running over several lines in another, a comment."""
    key = _pem("server.key").replace("\n", "\\n")
    return (f'# TLS for xgr serve\nserver_key: "{key}"\nserver_cert: "{_pem("server.pem")}"\n'
            f'custom_ca: "{_pem("ca.pem")}"\nclient_verify: {str(client_verify).lower()}\n')


def _https(port: int, client: str | None) -> tuple[int, dict]:
    context = ssl.create_default_context(cafile=str(TLS / "ca.pem"))
    if client is not None:
        context.load_cert_chain(str(TLS / f"{client}.pem"), str(TLS / f"{client}.key"))
    body = json.dumps({"inputs": columnar(REQUEST)}).encode()
    request = urllib.request.Request(f"https://localhost:{port}/v1/models/recs:predict", body)
    with urllib.request.urlopen(request, context=context, timeout=30) as response:
        return response.status, json.loads(response.read())


def _grpc(port: int, client: str | None):
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_pem("ca.pem").encode(),
        private_key=_pem(f"{client}.key").encode() if client else None,
        certificate_chain=_pem(f"{client}.pem").encode() if client else None)
    proto = predict_pb2.PredictRequest()
    proto.model_spec.name = "recs"
    for name, array in REQUEST.items():
        proto.inputs[name].CopyFrom(tf.make_tensor_proto(array))
    with grpc.secure_channel(f"localhost:{port}", credentials) as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
            proto, timeout=30)
    return tf.make_ndarray(response.outputs["score"])


@pytest.fixture(scope="module", params=[False, True], ids=["server_only", "client_verify"])
def tls_server(request, model_base):
    config = parse_ssl_config(_config_text(client_verify=request.param))
    running = start_server(model_base, file_system_poll_wait_seconds=0, ssl=config)
    yield running, request.param
    running.stop()


def test_both_ports_speak_tls_and_answer(tls_server):
    server, client_verify = tls_server
    client = "client" if client_verify else None
    expected = history_reference(1.0, **REQUEST)["score"]
    status, body = _https(server.rest_port, client)
    assert status == 200
    np.testing.assert_allclose(body["outputs"]["score"], expected, rtol=1e-6)
    np.testing.assert_allclose(_grpc(server.grpc_port, client), expected, rtol=1e-6)


def test_plain_text_clients_are_not_served(tls_server):
    server, _ = tls_server
    with pytest.raises(Exception):   # http.client sees a closed or garbled connection
        urllib.request.urlopen(f"http://127.0.0.1:{server.rest_port}/healthz", timeout=10).read()
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        with pytest.raises(grpc.RpcError) as failure:
            prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
                predict_pb2.PredictRequest(), timeout=10)
    assert failure.value.code() == grpc.StatusCode.UNAVAILABLE


def test_client_verify_refuses_clients_without_a_trusted_certificate(tls_server):
    server, client_verify = tls_server
    if not client_verify:
        assert _https(server.rest_port, "stranger")[0] == 200   # certificates not asked for
        return
    for client in (None, "stranger"):
        with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)):
            _https(server.rest_port, client)
        with pytest.raises(grpc.RpcError) as failure:
            _grpc(server.grpc_port, client)
        assert failure.value.code() == grpc.StatusCode.UNAVAILABLE


def test_the_ssl_config_file_is_checked():
    assert parse_ssl_config(_config_text(True)).server_key == _pem("server.key")
    with pytest.raises(ConfigError, match="unknown field 'server_keys'"):
        parse_ssl_config('server_keys: "x"')
    with pytest.raises(ConfigError, match="server_key and server_cert are required"):
        parse_ssl_config(f'server_cert: "{_pem("server.pem")}"')
    with pytest.raises(ConfigError, match="client_verify needs custom_ca"):
        SSLConfig(_pem("server.key"), _pem("server.pem"), client_verify=True)
    with pytest.raises(ConfigError, match="do not form a usable key pair"):
        start_server("unused", ssl=SSLConfig(_pem("client.key"), _pem("server.pem")))
    assert "PRIVATE" not in repr(parse_ssl_config(_config_text(False)))
