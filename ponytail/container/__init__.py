"""What the container asks for: OCI state and bundle, NVIDIA_* variables, requirements, the device plugin's list, a driver tree."""
