# Day-2 rolling driver upgrade (playbooks/upgrade-driver.yml, role driver_upgrade): lint, the molecule scenario
# molecule/driver-upgrade (four lab hosts paired with four Nodes of its own local control plane) and the
# benchmark of the playbook's per-node overhead.
DAY2_YAML_PATHS := roles/driver_upgrade playbooks/upgrade-driver.yml tests/ansible/day2 molecule/driver-upgrade
# Files, not the scenario directory: ansible-lint would take a directory for a role.
DAY2_LINT_PATHS := roles/driver_upgrade playbooks/upgrade-driver.yml tests/ansible/day2 \
                   $(wildcard molecule/driver-upgrade/*.yml molecule/driver-upgrade/tasks/*.yml \
                              molecule/driver-upgrade/vars/*.yml) plugins/modules/gpu_pod_eviction.py
DAY2_PYTHON := tests/ansible/day2/cluster.py bench/bench_day2.py bench/report.py plugins/modules/gpu_pod_eviction.py

.PHONY: lint-day2 molecule-day2 test-day2 bench-day2

lint-day2: venv ansible-collection ## yamllint, ansible-lint, ruff and mypy of the day-2 upgrade files
	@# ansible-lint gets its own ANSIBLE_HOME for the reason given in mk/ansible.mk (lint-ansible).
	$(BIN)/yamllint --strict $(DAY2_YAML_PATHS)
	@mkdir -p build/ansible-home
	ANSIBLE_HOME=$(CURDIR)/build/ansible-home $(BIN)/ansible-lint --offline --profile production $(DAY2_LINT_PATHS)
	$(BIN)/ruff check --line-length 110 --select E,F,W,I,B,UP,SIM,RUF $(DAY2_PYTHON)
	$(BIN)/ruff format --line-length 110 --check $(DAY2_PYTHON)
	$(BIN)/mypy --strict --ignore-missing-imports $(DAY2_PYTHON)

molecule-day2: venv ansible-collection controlplane ansible-host-image ## The driver-upgrade molecule scenario
	$(BIN)/molecule test -s driver-upgrade

test-day2: lint-day2 molecule-day2 ## Lint and run the day-2 upgrade scenario

bench-day2: venv ansible-collection controlplane ansible-host-image ## Per-node overhead of the upgrade playbook
	$(BIN)/python bench/bench_day2.py --out bench/results/day2.json

# After test-ansible (mk/ansible.mk is included first): it has built the host image and checked the roles.
EXTRA_TESTS += test-day2
