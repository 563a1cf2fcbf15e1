# Ansible collection gpuforge.nodes: lint, build, molecule scenarios, benchmark, lab hosts.
# Everything a run needs (apt tools, the Debian 12 host image, the imitation NVIDIA repositories) is
# installed or built here; the host image is cached outside the checkout (see docs/ansible.md).

ANSIBLE_DEPS := podman runc debootstrap dpkg-dev apt-utils gnupg zstd uidmap openssh-client openssl
ANSIBLE_LAB := $(BIN)/python tests/ansible/lab.py
ANSIBLE_PYTHON := tests/ansible/lab.py tests/ansible/imitation_repo.py tests/ansible/nvidia_packages.py tests/ansible/real_ctk.py tests/ansible/real_nfd.py tests/ansible/check_argspecs.py \
                  tests/ansible/unit bench/bench_ansible.py bench/report.py
ANSIBLE_YAML_PATHS := galaxy.yml meta changelogs requirements.yml roles playbooks inventory molecule .yamllint .ansible-lint
MOLECULE_SCENARIOS ?= default fleet branch-upgrade unsupported-os secure-boot brownfield distro
ANSIBLE_COLLECTION_LINK := collections/ansible_collections/gpuforge/nodes

.PHONY: ansible-deps ansible-collection ansible-host-image lint-ansible test-ansible bench-ansible \
        molecule-ansible ansible-lab-up ansible-lab-down

ansible-deps: ## apt packages the Ansible tests need (podman with runc, debootstrap, dpkg-dev, gnupg)
	@if ! command -v podman >/dev/null || ! command -v debootstrap >/dev/null \
	   || ! command -v dpkg-scanpackages >/dev/null || ! command -v apt-ftparchive >/dev/null \
	   || ! command -v runc >/dev/null || ! command -v ssh-keygen >/dev/null || ! command -v openssl >/dev/null \
	   || ! command -v zstd >/dev/null || ! command -v gpg >/dev/null; then \
	  echo "==> apt-get install $(ANSIBLE_DEPS)"; \
	  apt-get -o DPkg::Lock::Timeout=600 update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
	    --no-install-recommends $(ANSIBLE_DEPS) >/dev/null; \
	fi

$(ANSIBLE_COLLECTION_LINK):
	@mkdir -p $(dir $@)
	@ln -sfn ../../.. $@

ansible-collection: $(ANSIBLE_COLLECTION_LINK) ## Make the checkout resolvable as gpuforge.nodes

ansible-host-image: venv ansible-deps ## Build (or reuse from cache) the Debian host images for molecule and the demo
	@$(ANSIBLE_LAB) image --os debian12 >/dev/null
	@$(ANSIBLE_LAB) image --os debian13 >/dev/null

lint-ansible: venv ansible-collection ## yamllint, ansible-lint (production, offline), argspec check, unit tests, build
	$(BIN)/yamllint --strict $(ANSIBLE_YAML_PATHS)
	@# Its own ANSIBLE_HOME: a copy of gpuforge.nodes installed under ~/.ansible (by ansible-lint or galaxy)
	@# would shadow ./collections, and lint would check that stale copy instead of this checkout.
	@mkdir -p build/ansible-home
	ANSIBLE_HOME=$(CURDIR)/build/ansible-home $(BIN)/ansible-lint --offline --profile production
	$(BIN)/python tests/ansible/check_argspecs.py
	$(BIN)/ruff check --line-length 110 --select E,F,W,I,B,UP,SIM,RUF $(ANSIBLE_PYTHON)
	$(BIN)/ruff format --line-length 110 --check $(ANSIBLE_PYTHON)
	$(BIN)/mypy --strict $(filter-out tests/ansible/stubs/%,$(ANSIBLE_PYTHON))
	$(BIN)/pytest -q -p no:cacheprovider tests/ansible/unit
	@rm -rf build/collection && mkdir -p build/collection
	$(BIN)/ansible-galaxy collection build --force --output-path build/collection .
	$(BIN)/ansible-galaxy collection install --force -p build/collection/installed build/collection/gpuforge-nodes-*.tar.gz >/dev/null
	@test -f build/collection/installed/ansible_collections/gpuforge/nodes/plugins/modules/gpu_facts.py

molecule-ansible: venv ansible-collection ansible-host-image ## Run the molecule scenarios (MOLECULE_SCENARIOS=...)
	@set -e; for s in $(MOLECULE_SCENARIOS); do \
	  echo "==> molecule test -s $$s"; \
	  $(BIN)/molecule test -s $$s; \
	done

test-ansible: lint-ansible molecule-ansible ## Lint, build and run every molecule scenario of the collection

bench-ansible: venv ansible-collection ansible-host-image ## Time bootstrapping 1 and 10 nodes, and an idempotent re-run
	$(BIN)/python bench/bench_ansible.py --out bench/results/ansible.json

ansible-lab-up: venv ansible-collection ansible-host-image ## Start the imitation repos and one Debian host; print the inventory
	@$(ANSIBLE_LAB) up --name demo --hosts 1

ansible-lab-down: venv ## Stop the lab started by ansible-lab-up
	@$(ANSIBLE_LAB) down --name demo

EXTRA_TESTS += test-ansible
