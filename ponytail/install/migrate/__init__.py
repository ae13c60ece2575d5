"""``ponytail migrate --from nvidia``: move NVIDIA's container toolkit aside and put ponytail in its
place, reversibly (``--undo`` puts every file back byte for byte, with its mode and owner).

probe (nvidia.py: NVIDIA's CDI specs, the engine entries that run nvidia-container-runtime, its hook
binaries on the engines' PATH, its config) -> plan (plan.py: a list of steps, plain data, shown by
``--dry-run``) -> apply (apply.py: each file moved aside into the state directory, where no engine
reads, with a record of what was there and what ponytail put in its place).
"""
