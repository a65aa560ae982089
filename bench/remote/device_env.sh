# Sourced by the scripts that run on a lent device machine (gpu_session.sh, fleet_session.sh): the
# wheels the image lacks, carried in .whl/ (ignored), installed once per machine into /tmp/site,
# and this checkout installed in place. Expects OUT; sets PYTHONPATH.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ ! -f /tmp/site/.done ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && touch /tmp/site/.done || exit 1
fi
export PYTHONPATH=/tmp/site
python3 -m pip show dit-worker >/dev/null 2>&1 || python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null || exit 1
