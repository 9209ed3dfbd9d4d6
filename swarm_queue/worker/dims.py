"""An embeddings job's dimension as one endpoint's batches see it: fixed by the job's first
answer (in Redis, for every worker), and an answer of another dimension refused as the
endpoint's failure."""

from __future__ import annotations

from swarm_queue.common.errors import EndpointMalformed
from swarm_queue.common.models import JobSpec, Result
from swarm_queue.common.store import WorkerStore
from swarm_queue.worker.circuit import Circuit, GiveUp
from swarm_queue.worker.verify import EMBEDDINGS

__all__ = ["Dimensions", "keeps_vectors"]


def keeps_vectors(spec: JobSpec) -> bool:
    """Whether ``spec``'s job keeps its vectors (an embeddings job, not a measure's step,
    whose vectors are measured together and dropped): all of one dimension."""
    return spec.embed and spec.per_prompt is None


class Dimensions:
    """The dimensions of the jobs an endpoint embeds for, read once a job (a generation)."""

    def __init__(self, store: WorkerStore, label: str, circuit: Circuit) -> None:
        self.store, self.label, self.circuit = store, label, circuit
        self._dims: dict[tuple[str, str], int] = {}  # (job, generation) -> its dimension

    async def of(self, spec: JobSpec) -> int | None:
        """The dimension ``spec``'s vectors must have, once its first answer fixed it (None:
        not fixed yet, or the job keeps no vectors)."""
        if not keeps_vectors(spec):
            return None
        key = (spec.job, spec.generation)
        if key not in self._dims:
            dim = await self.store.job_dim(spec.job)
            if dim is None:
                return None
            self._dims[key] = dim
        return self._dims[key]

    async def fix(self, spec: JobSpec, sent: list[Result]) -> None:
        """Fix the job's dimension by this answer's, if it is the first; an answer of another
        dimension than the one fixed meanwhile is the endpoint's failure (GiveUp)."""
        got = next((len(r.embedding) // 4 for r in sent if r.embedding), None)
        if got is None:
            return
        dim = await self.store.fix_dim(spec.job, got, gen=spec.generation)
        self._dims[(spec.job, spec.generation)] = dim
        if dim != got:
            exc = EndpointMalformed(
                self.label,
                f"malformed answer: vectors of {got} dimensions (the job's vectors have {dim})",
                route=EMBEDDINGS,
            )
            self.circuit.failed(exc)
            raise GiveUp(exc)
