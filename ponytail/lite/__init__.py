"""Stand-ins for standard modules that a hook would otherwise import on every container start:
records (dataclasses), argv (click), plaintoml (tomllib). README.md here says what each saves."""
