"""ponytail-runtime: an OCI runtime shim for engines that read no hooks.d directory (Docker).

On ``create`` (and ``run``) of a container that asks for GPUs it adds the
ponytail prestart hook and the device rules to the bundle's config.json, then
execs the real runtime (runc unless ``[runtime] path`` says otherwise) with the
same arguments. Every other call, and every container that does not ask for
GPUs, is passed through untouched.
"""
