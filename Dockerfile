# swarm-queue worker image (also runs swarm-sim and the client commands).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY common common
COPY producer producer
COPY worker worker
COPY sim sim
COPY flows flows
# The one import name: swarm_queue/ links each folder above under it.
COPY swarm_queue swarm_queue
RUN pip install --no-cache-dir ".[uq]"
# Never run as root inside the container.
RUN useradd --create-home swarm
USER swarm
CMD ["arq", "swarm_queue.worker.WorkerSettings"]
