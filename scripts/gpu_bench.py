"""Rollout tokens/s and one GRPO update vs TRL's GRPOTrainer on one GPU (see
bench/gpu_bench.py for what is measured and how).

    python scripts/gpu_bench.py --tokenizer path/to/SmolLM2-135M-Instruct --out gpu_bench.json
    python scripts/gpu_bench.py --tiny --no-trl     # the same code path on a CPU
"""

from bench.gpu_bench import main

if __name__ == "__main__":
    main()
