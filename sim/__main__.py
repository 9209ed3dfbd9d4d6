"""python -m sim: run swarm-sim."""

from sim.server import main

main()
