#!/usr/bin/env bash
# Runs the paper-reproduction experiments on a GPU machine and draws their figures there.
#   bash experiments/paper/run_repro.sh A OUTDIR   # interventions (seed 0), seeds 1-4, no-LN
#   bash experiments/paper/run_repro.sh B OUTDIR   # scale rules rceil / floor_bump x 5 seeds (lr 6e-4)
#   bash experiments/paper/run_repro.sh C OUTDIR   # floor vs rceil x 5 seeds at lr 3e-4
#   bash experiments/paper/run_repro.sh D OUTDIR   # lr 4e-4 / 5e-4 x 5 seeds (FP32 + MX floor)
#   bash experiments/paper/run_repro.sh E OUTDIR   # lr 5e-4: scale rules rceil / floor_bump x 5 seeds
#   bash experiments/paper/run_repro.sh F OUTDIR   # lr 5e-4 seed 0: interventions at 4200 / 4800
#   bash experiments/paper/run_repro.sh G OUTDIR   # lr 5e-4: nearest-even x 5 seeds; depth 6 x 2 seeds
#   bash experiments/paper/run_repro.sh J OUTDIR   # stability instruments at lr 5e-4 (seeds 0-4; seed 0
#                                                  #   with snapshots at 4200/4800, interventions, mxlab eval)
#   [MXLAB_SHARD=i/n] [MXLAB_GPUS=0,1] bash experiments/paper/run_repro.sh K OUTDIR   # recipe arms
#                                                  #   study (shard i/n, or every seed), over those GPUs
#   [MXLAB_SHARD=i/n] [MXLAB_GPUS=0,1] [MXLAB_JOBS=4] [MXLAB_M_STUDIES=fresh_seeds_20k] bash experiments/paper/run_repro.sh M OUTDIR   # the fresh-seed
#                                                  #   20k-step study (3 arms) and its code-faithful twin
#   [MXLAB_GPUS=0,1] bash experiments/paper/run_repro.sh L OUTDIR   # the jump at a switch,
#                                                  #   explanations separated, 5 diverging seeds
#   bash experiments/paper/run_repro.sh H OUTDIR   # lr 5e-4: MLP vs attention block x 5 seeds
#   bash experiments/paper/run_repro.sh I OUTDIR   # lr 5e-4: layernorm vs RMSNorm vs MXNorm x 5 seeds
# MXLAB_REPRO_LIMIT=S stops the training S seconds after the part began, over all of its `mxlab run`
# calls together (the finished runs are still summarised; a rerun into the same OUTDIR resumes the
# others). MXLAB_REPRO_RUNS=DIR keeps the run files there instead of OUTDIR/runs.
# Needs build/mxlab (CUDA) and python3 with h5py + matplotlib. Run files go to OUTDIR/runs;
# figures (PNG) and summaries (CSV/text) to OUTDIR.
set -uo pipefail
PART=${1:?usage: run_repro.sh A|B|C|D|E|F|G|H|I|J|K|L|M OUTDIR}
OUT=${2:?usage: run_repro.sh A|B|C|D|E|F|G|H|I|J|K|L|M OUTDIR}
RUNS=${MXLAB_REPRO_RUNS:-$OUT/runs}
MX=${MXLAB_BIN:-./build/mxlab}
t0=$(date +%s)  # the part's start: its time limit and its wall time
# mxlab run, under the optional time limit.
train() {
  if [ -n "${MXLAB_REPRO_LIMIT:-}" ]; then
    local left=$(( MXLAB_REPRO_LIMIT - ($(date +%s) - t0) ))
    if [ "$left" -le 0 ]; then echo "time limit reached: skipping mxlab run $*" >&2; return 130; fi
    timeout "$left" $MX run "$@"
  else
    $MX run "$@"
  fi
}
# kargs (mxlab run's device and shard arguments) and tag (the summaries' shard name) of a
# sharded part: MXLAB_SHARD=i/n runs one shard, unset every run (in order, so a time limit leaves
# the first seeds finished); MXLAB_GPUS=0,1 spreads the runs over those GPUs, one at a time each;
# MXLAB_JOBS=N runs N at once (over the GPUs in turn: 4 over 0,1 is two per GPU, which share it
# through concurrent streams, each with the bits it writes alone). It saves little: on an H200 two
# 2000-step fresh_seeds_20k runs took 24 s together and 25 s one after the other; three per GPU
# were slower than two.
spread_args() {
  kargs=(--device cuda); tag=all
  if [ -n "${MXLAB_GPUS:-}" ]; then kargs=(--gpus "$MXLAB_GPUS"); fi
  if [ -n "${MXLAB_JOBS:-}" ]; then kargs+=(--jobs "$MXLAB_JOBS"); fi
  if [ -n "${MXLAB_SHARD:-}" ]; then kargs+=(--shard "$MXLAB_SHARD"); tag=${MXLAB_SHARD/\//of}; fi
}
# OUT/summary_NAME.csv for each run directory RUNS/NAME.
summaries() {
  for d in "$@"; do $MX summarize "$RUNS/$d" --csv > "$OUT/summary_$d.csv"; done
}
# The panel (figures 3, 5) and interventions (figure 4) figures of the first run file in RUNS/$1.
intervention_figures() {
  local f
  f=$(ls "$RUNS/$1"/*.h5 | head -n 1)
  python3 -m mxlab panel "$f" -o "$OUT/fig3_fig5_panel_$2.png"
  python3 -m mxlab interventions "$f" -o "$OUT/fig4_interventions_$2.png"
}
export PYTHONPATH=analysis
mkdir -p "$OUT" "$RUNS"
case "$PART" in
  A)
    train experiments/paper/repro_seed0_interventions.yaml --device cuda --out "$RUNS/seed0" --quiet
    train experiments/paper/repro_seeds.yaml --device cuda --out "$RUNS/seeds" --quiet --jobs 2
    train experiments/paper/repro_fig2b_no_ln.yaml --device cuda --out "$RUNS/noln" --quiet --jobs 2
    intervention_figures seed0 seed0
    summaries seed0 seeds noln
    python3 -m mxlab curves "$RUNS/noln" -o "$OUT/fig2b_no_ln.png" 2>&1 | tail -1
    ;;
  B)
    train experiments/paper/repro_scale_rules.yaml --device cuda --out "$RUNS/scale" --quiet --jobs 2
    summaries scale
    ;;
  C)
    train experiments/paper/repro_lr3e-4.yaml --device cuda --out "$RUNS/lr3e-4" --quiet --jobs 2
    summaries lr3e-4
    python3 -m mxlab curves "$RUNS/lr3e-4" --row precision.scale_rule -o "$OUT/lr3e-4_curves.png" 2>&1 | tail -1
    ;;
  D)
    train experiments/paper/repro_lr_search.yaml --device cuda --out "$RUNS/lr_search" --quiet --jobs 2
    summaries lr_search
    python3 -m mxlab curves "$RUNS/lr_search" --row optimizer.lr --color seed -o "$OUT/lr_search_curves.png" 2>&1 | tail -1
    ;;
  E)
    train experiments/paper/repro_scale_rules_lr5e-4.yaml --device cuda --out "$RUNS/scale_lr5e-4" --quiet --jobs 2
    summaries scale_lr5e-4
    python3 -m mxlab curves "$RUNS/scale_lr5e-4" --row precision.scale_rule --color seed -o "$OUT/scale_lr5e-4_curves.png" 2>&1 | tail -1
    ;;
  F)
    train experiments/paper/repro_lr5e-4_interventions.yaml --device cuda --out "$RUNS/lr5e-4_interventions" --quiet
    intervention_figures lr5e-4_interventions lr5e-4_seed0
    summaries lr5e-4_interventions
    ;;
  G)
    train experiments/paper/repro_rounding_lr5e-4.yaml --device cuda --out "$RUNS/rounding_lr5e-4" --quiet --jobs 2
    train experiments/paper/repro_depth6_lr5e-4.yaml --device cuda --out "$RUNS/depth6_lr5e-4" --quiet --jobs 2
    summaries rounding_lr5e-4 depth6_lr5e-4
    python3 -m mxlab curves "$RUNS/rounding_lr5e-4" "$RUNS/depth6_lr5e-4" --row model.depth --color seed -o "$OUT/knobs_lr5e-4_curves.png" 2>&1 | tail -1
    ;;
  H)
    train experiments/paper/attn_vs_mlp_lr5e-4.yaml --device cuda --out "$RUNS/attn_vs_mlp_lr5e-4" --quiet --jobs 2
    summaries attn_vs_mlp_lr5e-4
    python3 -m mxlab curves "$RUNS/attn_vs_mlp_lr5e-4" --row model.block --color seed -o "$OUT/attn_vs_mlp_lr5e-4_curves.png" 2>&1 | tail -1
    ;;
  I)
    train experiments/paper/norms_lr5e-4.yaml --device cuda --out "$RUNS/norms_lr5e-4" --quiet --jobs 2
    summaries norms_lr5e-4
    python3 -m mxlab curves "$RUNS/norms_lr5e-4" --row model.norm --color seed -o "$OUT/norms_lr5e-4_curves.png" 2>&1 | tail -1
    ;;
  J)
    # Seed 0 (curvature every 50, snapshots, interventions at 4200) and seeds 1-4 (curvature
    # every 100) into one directory; then the loss each switch causes at once (mxlab eval).
    train experiments/paper/instruments_lr5e-4_seed0.yaml --device cuda --out "$RUNS/instruments" --quiet
    train experiments/paper/instruments_lr5e-4.yaml --device cuda --out "$RUNS/instruments" --quiet --jobs 2
    f0=$($MX dump-config experiments/paper/instruments_lr5e-4_seed0.yaml --id)
    for s in 4200 4800; do
      $MX eval "$RUNS/instruments/$f0.h5" --snapshot $s --apply skip_ln_quant --apply bump_exponent --apply to_fp32 \
        --device cuda > "$OUT/eval_seed0_step$s.txt" 2>&1
      $MX eval "$RUNS/instruments/$f0.h5" --snapshot $s --apply skip_ln_quant --apply bump_exponent --apply to_fp32 \
        --train-batch --device cuda > "$OUT/eval_seed0_step${s}_train.txt" 2>&1
    done
    summaries instruments
    $MX summarize "$RUNS/instruments" --by arm --compare --csv > "$OUT/summary_by_arm_instruments.csv"
    python3 results/extract_series.py "$OUT/series_instruments" "$RUNS"/instruments/*.h5
    python3 -m mxlab warn "$RUNS/instruments" -o "$OUT/warn_lr5e-4.png" --csv "$OUT/warn_lr5e-4.csv" > "$OUT/warn_lr5e-4.txt" 2>&1
    intervention_figures instruments instruments_seed0
    ;;
  K)
    # The 32-seed arms study (spread_args: a shard, or every seed; over MXLAB_GPUS); commit its
    # summary_study_arms_*.csv under results/study_arms/, where results/study_arms.py merges them.
    spread_args
    train experiments/paper/study_arms_lr5e-4.yaml --out "$RUNS/study_arms" --quiet "${kargs[@]}"
    $MX summarize "$RUNS/study_arms" --csv > "$OUT/summary_study_arms_shard$tag.csv"
    $MX summarize "$RUNS/study_arms" --by arm --compare --csv > "$OUT/summary_by_arm_study_arms_shard$tag.csv"
    ;;
  L)
    # The jump at a switch, its two explanations separated (eight branches each): seed 0 at 4200,
    # seeds 1, 4, 15 at 8150, seed 25 at 2700 (every lr 5e-4 seed whose MX trajectory diverges);
    # then the loss each switch causes at once, at the snapshot, on the training batch.
    # MXLAB_GPUS=0,1: the three files at once over those GPUs (else one after another on cuda).
    if [ -n "${MXLAB_GPUS:-}" ]; then
      g0=${MXLAB_GPUS%%,*}; g1=${MXLAB_GPUS##*,}
      train experiments/paper/jump_lr5e-4_late.yaml --gpus "$MXLAB_GPUS" --out "$RUNS/jump_late" --quiet
      train experiments/paper/jump_lr5e-4_seed0.yaml --device "cuda:$g0" --out "$RUNS/jump" --quiet &
      train experiments/paper/jump_lr5e-4_seed25.yaml --device "cuda:$g1" --out "$RUNS/jump_seed25" --quiet
      wait
    else
      train experiments/paper/jump_lr5e-4_seed0.yaml --device cuda --out "$RUNS/jump" --quiet
      train experiments/paper/jump_lr5e-4_late.yaml --device cuda --out "$RUNS/jump_late" --quiet
      train experiments/paper/jump_lr5e-4_seed25.yaml --device cuda --out "$RUNS/jump_seed25" --quiet
    fi
    for fd in seed0:jump late:jump_late seed25:jump_seed25; do
      f=experiments/paper/jump_lr5e-4_${fd%%:*}.yaml; d=${fd##*:}
      step=$($MX dump-config "$f" --run 0 | grep -m1 snapshot_steps | tr -dc 0-9)  # --run: a sweep file has no single config
      n=$($MX plan "$f" | tail -1 | tr -dc 0-9)
      for ((i = 0; i < n; i++)); do
        id=$($MX dump-config "$f" --run "$i" --id)
        [ -f "$RUNS/$d/$id.h5" ] || continue
        $MX eval "$RUNS/$d/$id.h5" --snapshot "$step" --apply to_fp32 --apply snap_gamma+to_fp32 \
          --apply to_fp32_keep_gamma_q --apply skip_ln_quant --apply snap_gamma+skip_ln_quant --train-batch \
          --device cuda > "$OUT/eval_${d}_${id}_step${step}_train.txt" 2>&1
      done
    done
    summaries jump jump_late jump_seed25
    python3 results/extract_series.py "$OUT/series_jump" "$RUNS"/jump/*.h5 "$RUNS"/jump_late/*.h5 "$RUNS"/jump_seed25/*.h5
    ;;
  M)
    # Commit the summaries and loss blocks under results/fresh_seeds_20k/ and
    # results/code_faithful_20k/; then
    # results/study_arms.py --prefix summary_<name>_shard --split optimizer.lr (its docstring).
    # MXLAB_M_STUDIES="fresh_seeds_20k" (or code_faithful_20k) runs one of the two studies only.
    spread_args
    studies=${MXLAB_M_STUDIES:-fresh_seeds_20k code_faithful_20k}
    for d in $studies; do
      case "$d" in fresh_seeds_20k|code_faithful_20k) ;; *) echo "MXLAB_M_STUDIES: unknown study $d" >&2; exit 2 ;; esac
    done
    # A shard's runs in a directory of their own: the summaries and loss blocks of shard i hold
    # shard i's runs only, also where several shards ran in the same RUNS (one warm machine).
    sub=""
    [ -n "${MXLAB_SHARD:-}" ] && sub=_shard$tag
    for d in $studies; do
      train "experiments/paper/$d.yaml" --out "$RUNS/$d$sub" --quiet "${kargs[@]}"
    done
    for d in $studies; do
      $MX summarize "$RUNS/$d$sub" --csv > "$OUT/summary_${d}_shard$tag.csv"
      # The loss curves, as 100-step blocks (min/max/mean/last): the run files stay here.
      files=("$RUNS/$d$sub"/*.h5)
      [ -e "${files[0]}" ] || continue
      python3 results/extract_loss_blocks.py "$OUT/loss_blocks_${d}_shard$tag.csv" 100 "${files[@]}"
      # The code-faithful runs' logged series (Figs. 3-5 like for like with the paper's code).
      [ "$d" = code_faithful_20k ] && python3 results/extract_series.py "$OUT/series_${d}_shard$tag" "${files[@]}"
    done
    ;;
  *) echo "unknown part $PART (A|B|C|D|E|F|G|H|I|J|K|L|M)" >&2; exit 2 ;;
esac
echo "part $PART: $(( $(date +%s) - t0 )) s"
