"""The NPU address space RKLLM instances share (issue 45 item 6): rknpu maps a process's buffers
into an IOMMU domain of 4 GiB (``extend_param.base_domain_id``; llm_demo leaves every instance in
domain 0), so instances in one domain share 4 GiB whatever the board's RAM: a second Qwen3-4B
fails "failed to malloc npu memory" (rknn-llm issue 437), and runtime 1.3.0 segfaults instead
(issue 522). Admission (governor/api/admit.py) refuses such a second instance (75) before it
starts. The estimate of one instance is compile time's (governor/engines/rkllm_memory.py).

Standard library only (the run time's import set).
"""

from __future__ import annotations

NPU_DOMAIN_BYTES = 4 << 30  # one rknpu IOMMU domain (rknn-llm issue 437)


def npu_refusal(name: str, need: int, others: list[tuple[str, int]]) -> str | None:
    """Why a new RKLLM instance needing ``need`` bytes of NPU memory cannot start beside the
    running ``others`` (name, bytes) in the same domain; None when it fits."""
    held = sum(b for _n, b in others)
    if not others or held + need <= NPU_DOMAIN_BYTES:
        return None
    who = ", ".join(f"{n} {b >> 20} MiB" for n, b in others)
    return (
        f"{name} needs {need >> 20} MiB of NPU memory beside the running RKLLM instance(s)"
        f" ({who}): {(held + need) >> 20} MiB is above the NPU's {NPU_DOMAIN_BYTES >> 30} GiB"
        " address space (one rknpu IOMMU domain), where a second rkllm_init fails or, with"
        " runtime 1.3.0, segfaults"
    )
