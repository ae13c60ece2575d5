"""``ponytail dra-plugin``: the click command; the daemon is ponytail.dra.server's."""

from __future__ import annotations

import os
import sys

import click

from ponytail.cli.clickclasses import CONTEXT, Command, one_line_errors
from ponytail.config import config_path, load_config
from ponytail.errors import UsageError
from ponytail.hooks.command import installed_command


@click.command("dra-plugin", cls=Command, context_settings=CONTEXT)
@click.option("-config", "--config", "config", metavar="FILE", help="Config file (its [host] roots and [drivers.NAME] trees; as for the hook).")
@click.option("--driver-name", metavar="NAME", default=None,
              help="The DRA driver's name (a DNS subdomain). Default: gpu.ponytail.example.com; with --nvidia, gpu.nvidia.com.")
@click.option("--nvidia", "nvidia", is_flag=True,
              help="Stand in for NVIDIA's DRA driver: its driver name, so its DeviceClasses and claim templates work unchanged. "
                   "Refuses to start while NVIDIA's plugin is registered.")
@click.option("--node-name", metavar="NODE", envvar="NODE_NAME", required=True,
              help="This node's name: the pool and the ResourceSlice's node (env NODE_NAME; the DaemonSet sets it).")
@click.option("--kubeconfig", metavar="FILE", envvar="KUBECONFIG", default=None,
              help="How to reach the API server. Default: the pod's service account, else ~/.kube/config.")
@click.option("--service-account-dir", metavar="DIR", default=None,
              help="A service account's token and ca.crt (the DaemonSet's, seen from the host: it runs the plugin in the host's "
                   "mount namespace). Needs KUBERNETES_SERVICE_HOST and _PORT, as in a pod.")
@click.option("--plugin-dir", metavar="DIR", default=None, help="Where the DRA socket goes. Default: /var/lib/kubelet/plugins/<driver>.")
@click.option("--registry-dir", metavar="DIR", default="/var/lib/kubelet/plugins_registry", show_default=True,
              help="The kubelet's plugin registration directory.")
@click.option("--cdi-dir", metavar="DIR", default="/var/run/cdi", show_default=True, help="Where each claim's CDI spec is written.")
@click.option("--state-dir", metavar="DIR", default="/var/lib/ponytail/dra", show_default=True,
              help="The checkpoint of prepared claims (root's, kept across restarts).")
@click.option("--kmsg", metavar="PATH", default="/dev/kmsg", show_default=True,
              help="The kernel log read for Xid errors (a file or FIFO in tests; empty: no health).")
@click.option("--xid-effect", "xid_effects", metavar="XID=EFFECT", multiple=True,
              help="Taint effect for an Xid: NoSchedule, NoExecute or None (report only). Repeatable; overrides the defaults.")
@click.option("--resync", type=click.FloatRange(min=1.0, max=86400.0), metavar="SECONDS", default=60.0, show_default=True,
              help="How often the GPUs are probed again for the ResourceSlice (also on the driver's events).")
@click.option("--events", metavar="FIFO", default="", hidden=True, help="Tests: driver events from FIFO instead of the kernel and /dev.")
@click.option("--hook-path", metavar="CMD", default=None, help="ponytail as the claims' CDI hook runs it. Default: this install's.")
def dra_plugin(config: str | None, driver_name: str | None, nvidia: bool, node_name: str, kubeconfig: str | None, service_account_dir: str | None, plugin_dir: str | None,
               registry_dir: str, cdi_dir: str, state_dir: str, kmsg: str, xid_effects: tuple[str, ...], resync: float,
               events: str, hook_path: str | None) -> None:
    """Run ponytail's DRA kubelet plugin: the node's GPUs for ResourceClaims.

    \b
    It publishes one ResourceSlice for the node from ponytail's probe (no NVML): a device
    per GPU (gpu-0, gpu-1, ...; per MIG device where MIG is on) with the attributes claims
    select on: uuid, productName, brand, driverVersion, cudaDriverVersion, index, minor,
    resource.kubernetes.io/pciBusID and driverTrees. It registers with the kubelet and
    prepares each claim: it reads the claim's allocation and its opaque GpuConfig
    (driverTree, capabilities, require), checks them as the hook does, and writes one CDI
    spec per claim (<cdi dir>/ponytail-dra_<uid>.json) whose hook is ponytail cdi-hook.
    A claim that cannot work fails with one line in the pod's events. It reads the kernel
    log for Xid errors: the GPU turns unhealthy on the kubelet's health stream, its device
    gets a taint, and the log names the container that caused it.
    Examples:
      ponytail dra-plugin --node-name "$(hostname)"
      ponytail dra-plugin --nvidia --node-name node1 --kubeconfig /etc/kubernetes/kubelet.conf
      ponytail dra-plugin --node-name node1 --xid-effect 13=NoSchedule --xid-effect 79=NoExecute
    Install: deploy/kubernetes/ponytail-dra.yaml (docs/kubernetes.md, "Dynamic Resource Allocation").
    """
    with one_line_errors():
        try:
            import google.protobuf  # noqa: F401
            import h2  # noqa: F401 - here, to say what is missing in one line
            import kubernetes  # noqa: F401

            from ponytail.dra.health import parse_overrides
            from ponytail.dra.server import DEFAULT_DRIVER, NVIDIA_DRIVER, Settings, run
        except ImportError as e:
            raise UsageError(f"the DRA plugin needs h2, protobuf and kubernetes ({e.name} is missing): "
                             "pip install 'ponytail[dra]', or apt-get install python3-h2 python3-protobuf python3-kubernetes") from None
        loaded = load_config(*config_path(config))
        try:
            effects = parse_overrides(xid_effects)
        except ValueError as e:
            raise UsageError(str(e)) from None
        command = hook_path
        if command is None:
            command = installed_command()
        if command is None or not os.path.isabs(command):
            raise UsageError("cannot find this install's ponytail command by an absolute path; pass --hook-path CMD")
        driver = driver_name or (NVIDIA_DRIVER if nvidia else DEFAULT_DRIVER)
        if nvidia and driver != NVIDIA_DRIVER:
            raise UsageError(f"--nvidia stands in for {NVIDIA_DRIVER}; --driver-name {driver} contradicts it")
        settings = Settings(driver=driver, node=node_name, plugin_dir=plugin_dir or "", registry_dir=registry_dir, cdi_dir=cdi_dir,
                            state_dir=state_dir, kmsg=kmsg, kubeconfig=kubeconfig, service_account_dir=service_account_dir, resync_s=resync, hook_command=command, xid_effects=effects,
                            events=events)
        sys.exit(run(settings, loaded))
