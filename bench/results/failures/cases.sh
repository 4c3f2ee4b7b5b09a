#!/bin/bash
# The cases of "training that fails clearly", before and after: per case the command, its exit code and the last
# line on stderr. Run from the repository root:
#   git archive 5ca205d | tar -x -C /tmp/base
#   bench/results/failures/cases.sh /tmp/base before > bench/results/failures/cases-before.txt
#   bench/results/failures/cases.sh "$PWD" after > bench/results/failures/cases-after.txt
# (the full-disk case is a real write failing under `ulimit -f` with SIGXFSZ ignored).
tree=$1; label=$2; C=/tmp/e51/cases; O=/tmp/e51/cases/out-$label; rm -rf $O; mkdir -p $O
R=$(cd "$(dirname "$0")/../../.." && pwd); S=$R/data/samples; PY=${PYTHON:-$R/.venv/bin/python}  # PYTHON: another interpreter
if [ ! -f $C/good.jsonl ]; then  # the inputs: slices of the shipped samples with one bad row each
  mkdir -p $C/notes && echo hello > $C/notes/readme.txt
  head -24 $S/topics/train.jsonl > $C/good.jsonl
  (head -5 $C/good.jsonl; echo '{"text": "cut short'; sed -n 7,24p $C/good.jsonl) > $C/bad_json.jsonl
  (head -5 $C/good.jsonl; printf '{"text": "caf\xe9", "label": "places"}\n'; sed -n 7,24p $C/good.jsonl) > $C/bad_utf8.jsonl
  (head -5 $C/good.jsonl; echo '{"text": "a row without its label"}'; sed -n 7,24p $C/good.jsonl) > $C/no_label.jsonl
  : > $C/empty.jsonl
  (head -30 $S/entities/train.conll; echo; echo "Anna B-PER"; echo "smiles X-BAD"; echo) > $C/bad_tag.conll
  python3 - "$C" "$S" <<'PY'
import json, sys
c, s = sys.argv[1], sys.argv[2]
rows = [json.loads(line) for line in open(f"{c}/good.jsonl")]
with open(f"{c}/bad_fields.tsv", "w") as f:
    f.write("text\tlabel\n")
    for i, r in enumerate(rows):
        t = r["text"].replace("\t", " ")
        f.write(f"{t}\textra\t{r['label']}\n" if i == 4 else f"{t}\t{r['label']}\n")
with open(f"{c}/bad_utf8.csv", "wb") as f:
    f.write(b"text,label\n")
    for i, r in enumerate(rows):
        f.write(b'"caf\xe9",places\n' if i == 4 else ('"%s",%s\n' % (r["text"].replace('"', '""'), r["label"])).encode())
d = json.load(open(f"{s}/squad/train.json"))
d["data"] = d["data"][:1]
d["data"][0]["paragraphs"] = d["data"][0]["paragraphs"][:2]
d["data"][0]["paragraphs"][1]["qas"][0]["answers"][0]["answer_start"] = 100000
open(f"{c}/bad_answer.json", "w").write(json.dumps(d, indent=1))
PY
fi
common="--max-steps 4 --batch-size 4 --max-seq-length 32 --threads 1 --precision fp32 --no-progress-bar"
run() {  # name, args...
  name=$1; shift
  ( cd $tree && PYTHONPATH=$tree timeout 900 "$PY" -m berth.cli "$@" ) > $O/$name.out 2> $O/$name.err
  rc=$?
  echo "### $name"; echo "berth $*" | sed "s|$C/||g"; echo "exit $rc: $(tail -1 $O/$name.err)"
}
run broken_json finetune --task classification --train $C/bad_json.jsonl --out $O/m1 $common
run not_utf8 finetune --task classification --train $C/bad_utf8.jsonl --out $O/m2 $common
run no_label finetune --task classification --train $C/no_label.jsonl --out $O/m3 $common
run empty finetune --task classification --train $C/empty.jsonl --out $O/m4 $common
run tsv_fields finetune --task classification --train $C/bad_fields.tsv --out $O/m5 $common
run csv_utf8 finetune --task classification --train $C/bad_utf8.csv --out $O/m6 $common
run conll_tag finetune --task ner --train $C/bad_tag.conll --out $O/m7 $common
run squad_answer finetune --task qa --train $C/bad_answer.json --out $O/m8 $common
run base_not_checkpoint finetune --task classification --train $C/good.jsonl --out $O/m9 --base $C/notes $common
run seq_5000 finetune --task classification --train $C/good.jsonl --out $O/m10 $common --max-seq-length 5000
run lr_1e6 finetune --task classification --train $C/good.jsonl --out $O/m11 $common --lr 1e6 --warmup-steps 0
echo "    files in m11: $(ls $O/m11 | tr '\n' ' ')"
run good finetune --task classification --train $C/good.jsonl --out $O/m12 $common
( trap '' XFSZ; ulimit -f 65536; run full_disk finetune --task classification --train $C/good.jsonl --out $O/m12 $common --seed 7 )
echo "    m12 still loads: $(cd "$R" && PYTHONPATH="$R" "$PY" -c "from training.bert.checkpoint import load_pretrained; from training.bert.model import BertForSequenceClassification as B; print(load_pretrained(B, '$O/m12')[1])" 2>&1 | tail -1)"
