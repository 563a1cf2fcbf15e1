package main

import (
	"fmt"
	"strconv"
	"strings"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// flag: one of cmd/gpu-kubelet-plugin/main.go's urfave/cli flags, with the environment variable it also
// reads (a flag on the command line wins over the variable).
type flag struct {
	name     string
	env      string
	value    string
	required bool
}

type config struct {
	nodeName            string
	namespace           string
	imageName           string
	driverRoot          string
	cdiRoot             string
	kubeletRegistrarDir string
	kubeletPluginsDir   string
	healthcheckPort     int
	featureGates        map[string]bool
	kubeconfig          string
}

// knownFeatureGates: pkg/featuregates/featuregates.go of v25.12.0.
var knownFeatureGates = []string{
	"TimeSlicingSettings", "MPSSupport", "IMEXDaemonsWithDNSNames", "PassthroughSupport",
	"NVMLDeviceHealthCheck", "DynamicMIG", "ComputeDomainCliques", "CrashOnNVLinkFabricErrors",
}

func flagSet() []*flag {
	return []*flag{
		// Required: true in every release from v25.3.0 to v0.4.x (operands.yaml requiredFlags).
		{name: "node-name", env: "NODE_NAME", required: true},
		{name: "image-name", env: "IMAGE_NAME", required: true},
		{name: "namespace", env: "NAMESPACE", value: "default"},
		{name: "nvidia-driver-root", env: "NVIDIA_DRIVER_ROOT", value: "/"},
		{name: "cdi-root", env: "CDI_ROOT", value: "/etc/cdi"},
		{name: "kubelet-registrar-directory-path", env: "KUBELET_REGISTRAR_DIRECTORY_PATH", value: kubeletplugin.KubeletRegistryDir},
		{name: "kubelet-plugins-directory-path", env: "KUBELET_PLUGINS_DIRECTORY_PATH", value: kubeletplugin.KubeletPluginsDir},
		// v25.8 on; a negative port turns the health server off (main.go).
		{name: "healthcheck-port", env: "HEALTHCHECK_PORT", value: "-1"},
		// pkg/flags/featuregates.go, bound to FEATURE_GATES by pkg/flags/utils.go.
		{name: "feature-gates", env: "FEATURE_GATES"},
		// pkg/flags/kubeclient.go: empty means the in-cluster configuration.
		{name: "kubeconfig", env: "KUBECONFIG"},
	}
}

// parseFlags parses as urfave/cli v2 does: command line, then environment, then default; every Required
// flag set by neither fails the whole run with urfave's own message.
func parseFlags(args []string, getenv func(string) string) (*config, error) {
	flags := flagSet()
	byName := map[string]*flag{}
	for _, f := range flags {
		byName[f.name] = f
	}
	given := map[string]bool{}
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if !strings.HasPrefix(arg, "-") {
			return nil, fmt.Errorf("unexpected argument %q", arg)
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		f, ok := byName[name]
		if !ok {
			return nil, fmt.Errorf("flag provided but not defined: -%s", name)
		}
		if !hasValue {
			if i+1 >= len(args) {
				return nil, fmt.Errorf("flag needs an argument: -%s", name)
			}
			i++
			value = args[i]
		}
		f.value, given[name] = value, true
	}
	var missing []string
	for _, f := range flags {
		if !given[f.name] {
			if value := getenv(f.env); value != "" {
				f.value, given[f.name] = value, true
			}
		}
		if f.required && !given[f.name] {
			missing = append(missing, f.name)
		}
	}
	// urfave/cli v2 checkRequiredFlags (errors.go requiredFlagsErr).
	switch len(missing) {
	case 0:
	case 1:
		return nil, fmt.Errorf("Required flag %q not set", missing[0])
	default:
		return nil, fmt.Errorf("Required flags %q not set", strings.Join(missing, ", "))
	}
	port, err := strconv.Atoi(byName["healthcheck-port"].value)
	if err != nil {
		return nil, fmt.Errorf("invalid value %q for flag -healthcheck-port: %w", byName["healthcheck-port"].value, err)
	}
	gates, err := parseFeatureGates(byName["feature-gates"].value)
	if err != nil {
		return nil, err
	}
	return &config{
		nodeName:            byName["node-name"].value,
		namespace:           byName["namespace"].value,
		imageName:           byName["image-name"].value,
		driverRoot:          byName["nvidia-driver-root"].value,
		cdiRoot:             byName["cdi-root"].value,
		kubeletRegistrarDir: byName["kubelet-registrar-directory-path"].value,
		kubeletPluginsDir:   byName["kubelet-plugins-directory-path"].value,
		healthcheckPort:     port,
		featureGates:        gates,
		kubeconfig:          byName["kubeconfig"].value,
	}, nil
}

// parseFeatureGates: k8s.io/component-base/featuregate Set, "Name=bool" pairs separated by commas (the
// chart leaves a trailing one); a gate the release does not define stops the plugin.
func parseFeatureGates(text string) (map[string]bool, error) {
	known := map[string]bool{}
	for _, name := range knownFeatureGates {
		known[name] = true
	}
	gates := map[string]bool{}
	for _, item := range strings.Split(text, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, value, _ := strings.Cut(item, "=")
		name = strings.TrimSpace(name)
		if !known[name] {
			return nil, fmt.Errorf("unrecognized feature gate: %s", name)
		}
		enabled, err := strconv.ParseBool(strings.TrimSpace(value))
		if err != nil {
			return nil, fmt.Errorf("invalid value of %s=%s, err: %v", name, value, err)
		}
		gates[name] = enabled
	}
	return gates, nil
}
