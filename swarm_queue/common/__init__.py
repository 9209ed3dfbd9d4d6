"""swarm-queue."""
