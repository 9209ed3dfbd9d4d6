"""swarm-queue's client side: the producer, the collector, the operator commands, and the
Python API (:mod:`swarm_queue.producer.api`, whose public names :mod:`swarm_queue` hands on,
imported lazily so the command-line tools start without loading the drain engine)."""
