"""ponytail: an OCI prestart hook that gives a container the host's NVIDIA GPUs.

The flow is probe -> plan -> apply: ``ponytail.host`` reads the host (read-only),
``ponytail.plan.operations`` turns what was found and what the container asks for into plain
data, and ``ponytail.apply`` is the only code that changes anything.
"""

__version__ = "0.1.0"
