# The Helm chart charts/gpuforge, generated from the kustomize base operator/deploy (the source of truth),
# and helm itself, built from the Go module proxy into $GPUFORGE_CACHE/tools like the control plane.
# See docs/install.md.

.PHONY: chart helm

chart: venv ## Regenerate charts/gpuforge from operator/deploy (commit the result)
	@cd operator && $(BIN)/python -m gpuforge_lab.devcluster.chart

helm: venv ## Build (or reuse from cache) the pinned helm; tests render the chart with it
	@$(GPUFORGE) dev helm >/dev/null

# The chart's tests run helm template against kubectl kustomize.
test test-integration: helm
