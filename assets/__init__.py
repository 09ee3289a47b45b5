"""Middle floor: the four phases, their transforms, schemas and the one phase runner."""
