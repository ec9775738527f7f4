"""TLS for both ports from TF Serving's ``SSLConfig`` (``--ssl_config_file``).

The config holds PEM text. gRPC takes it as bytes; Python's ``ssl`` module reads a key pair
only from files, so the pair is written to a private temporary folder (mode 0700, files 0600)
for the moment ``load_cert_chain`` reads it and removed right after.
"""

from __future__ import annotations

import os
import ssl
import tempfile

import grpc

from xgr_common.errors import ConfigError
from tf_frontend.serving.config import SSLConfig


def grpc_server_credentials(config: SSLConfig) -> grpc.ServerCredentials:
    """gRPC server credentials; client certificates are checked against ``custom_ca`` when
    ``client_verify`` is set."""
    return grpc.ssl_server_credentials(
        [(config.server_key.encode(), config.server_cert.encode())],
        root_certificates=config.custom_ca.encode() if config.custom_ca else None,
        require_client_auth=config.client_verify)


def rest_ssl_context(config: SSLConfig) -> ssl.SSLContext:
    """A server context (TLS 1.2 or newer) with the key pair and, when ``client_verify``, a
    required client certificate signed by ``custom_ca``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory(prefix="xgr-tls-") as folder:   # created with mode 0700
        cert, key = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
        for path, text in ((cert, config.server_cert), (key, config.server_key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
        try:
            context.load_cert_chain(cert, key)
        except ssl.SSLError as e:
            raise ConfigError(f"ssl config: server_key and server_cert do not form a usable "
                              f"key pair: {e.reason or e}") from e
    if config.custom_ca:
        try:
            context.load_verify_locations(cadata=config.custom_ca)
        except ssl.SSLError as e:
            raise ConfigError(f"ssl config: custom_ca is not a usable CA certificate: "
                              f"{e.reason or e}") from e
    context.verify_mode = ssl.CERT_REQUIRED if config.client_verify else ssl.CERT_NONE
    return context
