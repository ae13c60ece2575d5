"""What ponytail knows of each container engine, one module each (docker, containerd/, crio, podman
and their hooks.d file, hooksd): its record (registry), ``edit()`` of its config, and
``registered(root)``, which reads back what ``edit()`` wrote."""
