"""Convert a checkpoint written by DeepSpeed into a dsrecipes checkpoint, or its weights into safetensors.

    python -m dsrecipes.convert_ds_checkpoint ds_ckpt converted            # converted/step_N, converted/latest
    python -m dsrecipes ... trainer.resume=converted                        # resume it (any world size, ZeRO stage)
    python -m dsrecipes.convert_ds_checkpoint ds_ckpt model.safetensors --safetensors

SRC is the folder DeepSpeed's `save_checkpoint` wrote (holding `latest`) or one of its global_stepN
folders (--tag picks another). ZeRO 0-3 at any data-parallel world size, fp32 / bf16 / fp16; the
weights are DeepSpeed's fp32 masters where it kept them. DeepSpeed itself need not be installed.
(`trainer.resume=SRC` also reads DeepSpeed's folder directly, without converting.)
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    from dsrecipes.training.checkpointing.deepspeed_checkpoint import read_deepspeed_checkpoint
    from dsrecipes.training.checkpointing.deepspeed_conversion import write_converted_checkpoint, write_safetensors
    from dsrecipes.utils.errors import USER_ERRORS, exit_on_user_error

    parser = argparse.ArgumentParser(prog="python -m dsrecipes.convert_ds_checkpoint", description=__doc__.splitlines()[0])
    parser.add_argument("src", help="a DeepSpeed checkpoint folder (with `latest`) or a global_stepN folder")
    parser.add_argument("dst", help="the dsrecipes checkpoint folder to write, or the .safetensors file with --safetensors")
    parser.add_argument("--tag", help="the tag folder inside SRC to read (default: what SRC/latest names)")
    parser.add_argument("--safetensors", action="store_true", help="write the weights only, as one safetensors file")
    args = parser.parse_args(argv)
    try:
        ckpt = read_deepspeed_checkpoint(args.src, args.tag)
        if args.safetensors:
            out = write_safetensors(ckpt, args.dst)
            what = f"{len(ckpt.weights)} tensors"
        else:
            out = write_converted_checkpoint(ckpt, args.dst)
            what = (f"weights, optimizer state of {len(ckpt.optimizer_state)} parameters, step {ckpt.global_steps}, "
                    f"lr schedule {ckpt.lr_scheduler}")
    except USER_ERRORS as error:
        exit_on_user_error(error)
    print(f"{ckpt.path} (DeepSpeed {ckpt.ds_version}, ZeRO-{ckpt.zero_stage}, {ckpt.dp_world_size} rank(s)) -> {out}: {what}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
