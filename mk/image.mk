# The operator image, built without a registry: a debootstrap Debian 12 base (cached under
# $GPUFORGE_CACHE/image, keyed by its recipe) and `podman build` of operator/Dockerfile on top.
# See docs/install.md.

.PHONY: image test-image

image: venv ansible-deps ## Build (or reuse) the operator image localhost/gpuforge-operator:<version>
	@cd operator && $(BIN)/python -m gpuforge_lab.devcluster.image

test-image: image controlplane ## Run the image as a pod would against the local control plane
	cd operator && $(BIN)/pytest -q tests/integration/release/test_image.py $(PYTEST_ARGS)
