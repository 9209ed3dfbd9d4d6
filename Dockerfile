# swarm-queue worker image (also runs swarm-sim and the client commands).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
# The one import name: every package of the product is a folder of swarm_queue/.
COPY swarm_queue swarm_queue
RUN pip install --no-cache-dir ".[uq]"
# Never run as root inside the container.
RUN useradd --create-home swarm
USER swarm
CMD ["arq", "swarm_queue.worker.WorkerSettings"]
