"""Model status and metadata as TF Serving's protos (gRPC) and their JSON forms (REST)."""

from __future__ import annotations

from typing import Any, Sequence

from google.protobuf import json_format
from tensorflow_serving.apis import get_model_metadata_pb2, get_model_status_pb2

from tf_frontend.serving.model_manager import VersionStatus
from tf_frontend.serving.servable import ServableVersion

_STATES = get_model_status_pb2.ModelVersionStatus.State
_UNKNOWN_ERROR = 2  # tensorflow.error.Code.UNKNOWN: a failed load


def status_response(statuses: Sequence[VersionStatus]) -> get_model_status_pb2.GetModelStatusResponse:
    response = get_model_status_pb2.GetModelStatusResponse()
    for status in statuses:
        entry = response.model_version_status.add()
        entry.version = status.version
        entry.state = _STATES.Value(status.state)
        if status.error:
            entry.status.error_code = _UNKNOWN_ERROR
            entry.status.error_message = status.error
    return response


def status_json(statuses: Sequence[VersionStatus]) -> dict[str, Any]:
    """TF Serving's REST body for ``GET /v1/models/NAME[/versions/N]``."""
    return {"model_version_status": [
        {"version": str(s.version), "state": s.state,
         "status": {"error_code": "UNKNOWN" if s.error else "OK", "error_message": s.error}}
        for s in statuses]}


def signature_def_map(version: ServableVersion) -> get_model_metadata_pb2.SignatureDefMap:
    """The version's serving signatures (the SavedModel's init-op entry left out)."""
    result = get_model_metadata_pb2.SignatureDefMap()
    for name, signature in version.signature_defs.items():
        if not name.startswith("__"):
            result.signature_def[name].CopyFrom(signature)
    return result


def metadata_response(version: ServableVersion) -> get_model_metadata_pb2.GetModelMetadataResponse:
    response = get_model_metadata_pb2.GetModelMetadataResponse()
    response.model_spec.name = version.model_name
    response.model_spec.version.value = version.version
    response.metadata["signature_def"].Pack(signature_def_map(version))
    return response


def metadata_json(version: ServableVersion) -> dict[str, Any]:
    """TF Serving's REST body for ``GET /v1/models/NAME[/versions/N]/metadata``."""
    signatures = json_format.MessageToDict(signature_def_map(version),
                                           preserving_proto_field_name=True)
    return {"model_spec": {"name": version.model_name, "signature_name": "",
                           "version": str(version.version)},
            "metadata": {"signature_def": signatures}}
