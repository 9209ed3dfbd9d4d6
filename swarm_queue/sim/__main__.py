"""python -m swarm_queue.sim: run swarm-sim."""

from swarm_queue.sim.server import main

main()
