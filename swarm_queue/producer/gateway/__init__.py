"""``swarm-gateway``: the OpenAI Batch API served over the queue (``main``: the command;
``app``: the routes; ``driver``: a batch's life; ``validate``: its input checked;
``files``: where file bytes live; ``projects``: who may call, as which project)."""
