"""Ground floor: everything that touches the outside world (PostgreSQL, Delta, files, HTTP)."""
