"""python -m swarm_queue.sim: run swarm-sim."""

from swarm_queue.sim.cli import main

main()
