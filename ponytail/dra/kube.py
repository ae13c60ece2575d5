"""The API server, through the ``kubernetes`` client (PyPI's, or Debian's python3-kubernetes).

Only the client's transport is used (its configuration, in-cluster or kubeconfig, its auth and
TLS, ``call_api``): objects go in and out as plain JSON, so that any client release speaks
resource.k8s.io/v1 (Debian 12's 22.6 predates it) and no field a newer API server adds is dropped
by a model class. Errors become one-line ``KubeError``s naming the call.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ponytail.errors import PonytailError

GROUP = "/apis/resource.k8s.io/v1"


class KubeError(PonytailError):
    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class Kube:
    def __init__(self, kubeconfig: str | None = None, service_account_dir: str | None = None) -> None:
        """``kubeconfig``, else the service account's token and CA in ``service_account_dir`` (a pod's
        /var/run/secrets/kubernetes.io/serviceaccount seen from the host: the DaemonSet runs the plugin in
        the host's mount namespace), else the pod's own, else ~/.kube/config."""
        from kubernetes import client, config

        configuration = client.Configuration()
        try:
            if kubeconfig:
                config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
            elif service_account_dir:
                from kubernetes.config.incluster_config import InClusterConfigLoader

                InClusterConfigLoader(os.path.join(service_account_dir, "token"), os.path.join(service_account_dir, "ca.crt")).load_and_set(configuration)
            else:
                try:
                    config.load_incluster_config(client_configuration=configuration)
                except config.ConfigException:
                    config.load_kube_config(client_configuration=configuration)
        except (config.ConfigException, OSError, ValueError) as e:
            where = f"--kubeconfig {kubeconfig}" if kubeconfig else f"--service-account-dir {service_account_dir}" if service_account_dir else \
                "the pod's service account or ~/.kube/config"
            raise KubeError(f"cannot reach the API server with {where}: {e}") from None
        self.api = client.ApiClient(configuration)

    def call(self, method: str, path: str, body: dict | None = None, query: list[tuple[str, str]] | None = None) -> Any:
        """The JSON the API server answers ``method path`` with; KubeError (with the HTTP status) otherwise."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        try:
            if hasattr(self.api, "param_serialize"):  # the client's 2025 generator (kubernetes 35+)
                verb, url, headers, data, post = self.api.param_serialize(
                    method, path, query_params=query or [], header_params=headers, body=body, auth_settings=["BearerToken"])
                response = self.api.call_api(verb, url, header_params=headers, body=data, post_params=post, _request_timeout=30)
                text, status, reason = response.read(), response.status, response.reason
            else:  # earlier clients (Debian 12's 22.6)
                response = self.api.call_api(
                    path, method, query_params=query or [], header_params=headers, body=body, auth_settings=["BearerToken"],
                    _preload_content=False, _return_http_data_only=True, _request_timeout=30)
                text, status, reason = response.data, 200, ""
        except ApiException as e:
            raise KubeError(f"{method} {path}: HTTP {e.status} {_reason(e.body) or e.reason}", e.status or 0) from None
        except (HTTPError, OSError) as e:
            raise KubeError(f"{method} {path}: {type(e).__name__}: {e}") from None
        if not 200 <= status < 300:
            raise KubeError(f"{method} {path}: HTTP {status} {_reason(text) or reason}", status)
        try:
            return json.loads(text) if text else None
        except ValueError as e:
            raise KubeError(f"{method} {path}: the API server's answer is not JSON: {e}") from None

    def claim(self, namespace: str, name: str) -> dict:
        return self.call("GET", f"{GROUP}/namespaces/{namespace}/resourceclaims/{name}")

    def slices(self, node: str, driver: str) -> list[dict]:
        found = self.call("GET", f"{GROUP}/resourceslices", query=[("fieldSelector", f"spec.nodeName={node},spec.driver={driver}")])
        return list((found or {}).get("items") or [])

    def create_slice(self, obj: dict) -> dict:
        return self.call("POST", f"{GROUP}/resourceslices", obj)

    def replace_slice(self, obj: dict) -> dict:
        return self.call("PUT", f"{GROUP}/resourceslices/{obj['metadata']['name']}", obj)

    def delete_slice(self, name: str) -> None:
        try:
            self.call("DELETE", f"{GROUP}/resourceslices/{name}")
        except KubeError as e:
            if e.status != 404:
                raise


def _reason(body: object) -> str:
    try:
        return str(json.loads(body).get("message", ""))  # type: ignore[arg-type]
    except (TypeError, ValueError, AttributeError):
        return ""
