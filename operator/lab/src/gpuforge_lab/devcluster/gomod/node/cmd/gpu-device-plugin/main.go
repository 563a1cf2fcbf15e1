// Command gpu-device-plugin serves the kubelet's device-plugin API for pretend GPUs, taking the flags and
// environment of NVIDIA's k8s-device-plugin release (v0.17.0 - v0.20.0) and failing where it fails.
//
// The GPUs are the ones the host's simulated hardware file describes. That file stands in for NVML: like
// libnvidia-ml and the /dev/nvidia* nodes, the container sees it only where the nvidia container runtime
// injected it (the lab's nvidia runtime handler does, into containers whose NVIDIA_VISIBLE_DEVICES asks
// for GPUs). Under plain runc the plugin finds no NVML and exits, as the release does.
//
// Upstream files named below are NVIDIA/k8s-device-plugin's, at v0.20.0 unless a tag is given.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"sigs.k8s.io/yaml"
)

const (
	// consts.go: the resource and the suffix renameByDefault gives it.
	resourceName = "nvidia.com/gpu"
	sharedSuffix = ".shared"
	// internal/plugin/server.go: the plugin's socket beside the kubelet's, named after the resource.
	socketName = "nvidia-gpu.sock"
	// The kind of the CDI devices the plugin generates: the vendor is set in
	// cmd/nvidia-device-plugin/plugin-manager.go (cdi.WithVendor), the class in internal/cdi/cdi.go
	// (nvcdi.WithClass("gpu")), which saves the spec as /var/run/cdi/<vendor>-<class>.json.
	cdiKind = "k8s.device-plugin.nvidia.com/gpu"
	// api/config/v1/consts.go DefaultCDIAnnotationPrefix.
	defaultCDIAnnotationPrefix = "cdi.k8s.io/"
	// Where the pretend NVML is found once the runtime injected it (the lab's hardware file).
	nvmlPath = "/var/lib/gpuforge-sim/gpus.json"
)

// Errors in the release's words (operator/src/gpuforge/compat/operands.yaml `errors`).
var errNvmlUnavailable = errors.New("failed to initialize NVML: ERROR_LIBRARY_NOT_FOUND")

type gpu struct {
	Index int    `json:"index"`
	Name  string `json:"name"`
	UUID  string `json:"uuid"`
}

// option is one flag of cmd/nvidia-device-plugin/main.go: its names and the environment variables it
// reads (urfave/cli v2: a flag given on the command line wins over its variables, which win over the
// config file, which wins over the default; api/config/v1/config.go NewConfig, flags.go updateFromCLIFlag).
type option struct {
	names    []string
	env      []string
	isBool   bool
	fallback string
	value    string
	set      bool
}

func options() map[string]*option {
	list := []*option{
		{names: []string{"mig-strategy"}, env: []string{"MIG_STRATEGY"}, fallback: "none"},
		{names: []string{"fail-on-init-error"}, env: []string{"FAIL_ON_INIT_ERROR"}, isBool: true, fallback: "true"},
		{names: []string{"nvidia-driver-root"}, env: []string{"NVIDIA_DRIVER_ROOT"}, fallback: "/"},
		{names: []string{"dev-root", "nvidia-dev-root"}, env: []string{"NVIDIA_DEV_ROOT"}},
		{names: []string{"pass-device-specs"}, env: []string{"PASS_DEVICE_SPECS"}, isBool: true, fallback: "false"},
		{names: []string{"device-list-strategy"}, env: []string{"DEVICE_LIST_STRATEGY"}, fallback: "envvar"},
		{names: []string{"device-id-strategy"}, env: []string{"DEVICE_ID_STRATEGY"}, fallback: "uuid"},
		{names: []string{"gdrcopy-enabled"}, env: []string{"GDRCOPY_ENABLED"}, isBool: true, fallback: "false"},
		{names: []string{"gds-enabled"}, env: []string{"GDS_ENABLED"}, isBool: true, fallback: "false"},
		{names: []string{"mofed-enabled"}, env: []string{"MOFED_ENABLED"}, isBool: true, fallback: "false"},
		{names: []string{"kubelet-socket"}, env: []string{"KUBELET_SOCKET"}, fallback: pluginapi.KubeletSocket},
		{names: []string{"config-file"}, env: []string{"CONFIG_FILE"}},
		{names: []string{"cdi-annotation-prefix"}, env: []string{"CDI_ANNOTATION_PREFIX"}, fallback: defaultCDIAnnotationPrefix},
		{names: []string{"nvidia-cdi-hook-path", "nvidia-ctk-path"}, env: []string{"NVIDIA_CDI_HOOK_PATH", "NVIDIA_CTK_PATH"}, fallback: "/usr/bin/nvidia-cdi-hook"},
		{names: []string{"driver-root-ctr-path", "container-driver-root"}, env: []string{"DRIVER_ROOT_CTR_PATH", "CONTAINER_DRIVER_ROOT"}, fallback: "/driver-root"},
		{names: []string{"device-discovery-strategy"}, env: []string{"DEVICE_DISCOVERY_STRATEGY"}, fallback: "auto"},
		{names: []string{"imex-channel-ids"}, env: []string{"IMEX_CHANNEL_IDS"}},
		{names: []string{"imex-required"}, env: []string{"IMEX_REQUIRED"}, isBool: true, fallback: "false"},
		{names: []string{"mps-root"}, env: []string{"MPS_ROOT"}},
		{names: []string{"v"}, fallback: "0"},
	}
	byName := map[string]*option{}
	for _, o := range list {
		for _, name := range o.names {
			byName[name] = o
		}
	}
	return byName
}

type boolValue struct{ o *option }

func (b boolValue) String() string { return b.o.value }
func (b boolValue) Set(s string) error {
	if _, err := strconv.ParseBool(s); err != nil {
		return err
	}
	b.o.value, b.o.set = s, true
	return nil
}
func (b boolValue) IsBoolFlag() bool { return true }

type stringValue struct{ o *option }

func (s stringValue) String() string { return s.o.value }
func (s stringValue) Set(v string) error {
	s.o.value, s.o.set = v, true
	return nil
}

// parseOptions reads the command line, then the variables of the flags not given there.
func parseOptions(args []string) (map[string]*option, error) {
	opts := options()
	set := flag.NewFlagSet("nvidia-device-plugin", flag.ContinueOnError)
	set.SetOutput(io.Discard)
	for name, o := range opts {
		if o.isBool {
			set.Var(boolValue{o}, name, "")
		} else {
			set.Var(stringValue{o}, name, "")
		}
	}
	if err := set.Parse(args); err != nil {
		// urfave/cli v2's words for a flag the release does not define.
		return nil, fmt.Errorf("Incorrect Usage: %v", err)
	}
	for _, o := range opts {
		if o.set {
			continue
		}
		for _, name := range o.env {
			value, ok := os.LookupEnv(name)
			if !ok {
				continue
			}
			if o.isBool {
				if _, err := strconv.ParseBool(value); err != nil {
					// urfave/cli v2 flag_bool.go Apply.
					return nil, fmt.Errorf("could not parse %q as bool value from env %s for flag %s: %v",
						value, name, o.names[0], err)
				}
			}
			o.value, o.set = value, true
			break
		}
	}
	return opts, nil
}

// config is the part of the `version: v1` config file (api/config/v1/config.go) this plugin acts on.
type config struct {
	Version string `json:"version"`
	Flags   struct {
		MigStrategy     *string `json:"migStrategy"`
		FailOnInitError *bool   `json:"failOnInitError"`
		Plugin          struct {
			PassDeviceSpecs    *bool           `json:"passDeviceSpecs"`
			DeviceListStrategy json.RawMessage `json:"deviceListStrategy"`
			DeviceIDStrategy   *string         `json:"deviceIDStrategy"`
		} `json:"plugin"`
	} `json:"flags"`
	Sharing struct {
		TimeSlicing struct {
			RenameByDefault bool `json:"renameByDefault"`
			Resources       []struct {
				Name     string `json:"name"`
				Replicas int    `json:"replicas"`
			} `json:"resources"`
		} `json:"timeSlicing"`
	} `json:"sharing"`
}

// settings are the values the plugin runs with, flags and config file merged.
type settings struct {
	migStrategy        string
	failOnInitError    bool
	deviceListStrategy []string
	deviceIDStrategy   string
	cdiPrefix          string
	kubeletSocket      string
	replicas           int
	renameByDefault    bool
}

func loadSettings(opts map[string]*option) (settings, error) {
	var file config
	if path := opts["config-file"].value; path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			// api/config/v1/config.go parseConfig.
			return settings{}, fmt.Errorf("unable to finalize config: unable to parse config file: read file: %v", err)
		}
		if err := yaml.Unmarshal(data, &file); err != nil {
			return settings{}, fmt.Errorf("unable to finalize config: unable to parse config file: unmarshal error: %v", err)
		}
		// api/config/v1/config.go: only version v1 is known.
		if file.Version != "" && file.Version != "v1" {
			return settings{}, fmt.Errorf("unable to finalize config: unable to parse config file: unknown version: %v", file.Version)
		}
	}
	pick := func(name string, fromFile *string) string {
		o := opts[name]
		switch {
		case o.set:
			return o.value
		case fromFile != nil:
			return *fromFile
		}
		return o.fallback
	}
	pickBool := func(name string, fromFile *bool) bool {
		if o := opts[name]; !o.set && fromFile != nil {
			return *fromFile
		}
		value, _ := strconv.ParseBool(pick(name, nil))
		return value
	}
	s := settings{
		migStrategy:      pick("mig-strategy", file.Flags.MigStrategy),
		failOnInitError:  pickBool("fail-on-init-error", file.Flags.FailOnInitError),
		deviceIDStrategy: pick("device-id-strategy", file.Flags.Plugin.DeviceIDStrategy),
		cdiPrefix:        pick("cdi-annotation-prefix", nil),
		kubeletSocket:    pick("kubelet-socket", nil),
		renameByDefault:  file.Sharing.TimeSlicing.RenameByDefault,
		replicas:         1,
	}
	// urfave/cli StringSliceFlag: a comma-separated list, on the command line or in the variable.
	listOpt := opts["device-list-strategy"]
	switch {
	case listOpt.set:
		s.deviceListStrategy = strings.Split(listOpt.value, ",")
	case len(file.Flags.Plugin.DeviceListStrategy) > 0:
		// api/config/v1/flags.go deviceListStrategyFlag: one string or a list of them.
		var one string
		if json.Unmarshal(file.Flags.Plugin.DeviceListStrategy, &one) == nil {
			s.deviceListStrategy = []string{one}
		} else if err := json.Unmarshal(file.Flags.Plugin.DeviceListStrategy, &s.deviceListStrategy); err != nil {
			return settings{}, fmt.Errorf("unable to finalize config: unable to parse config file: unmarshal error: %v", err)
		}
	default:
		s.deviceListStrategy = []string{listOpt.fallback}
	}
	for _, r := range file.Sharing.TimeSlicing.Resources {
		// api/config/v1/replicas.go UnmarshalJSON.
		if r.Replicas < 2 {
			return settings{}, errors.New("number of replicas must be >= 2")
		}
		if r.Name == resourceName {
			s.replicas = r.Replicas
		}
	}
	return s, nil
}

// validate is cmd/nvidia-device-plugin/main.go validateFlags, for a machine whose NVML was found.
func (s settings) validate(opts map[string]*option) error {
	known := map[string]bool{"envvar": true, "volume-mounts": true, "cdi-annotations": true, "cdi-cri": true}
	for _, strategy := range s.deviceListStrategy {
		if !known[strategy] {
			// api/config/v1/strategy.go NewDeviceListStrategies.
			return fmt.Errorf("invalid --device-list-strategy option: invalid strategy: %v", strategy)
		}
	}
	if s.deviceIDStrategy != "uuid" && s.deviceIDStrategy != "index" {
		return fmt.Errorf("invalid --device-id-strategy option: %v", s.deviceIDStrategy)
	}
	switch d := opts["device-discovery-strategy"]; d.value {
	case "", "auto", "nvml", "tegra":
	default:
		return fmt.Errorf("invalid --device-discovery-strategy option %v", d.value)
	}
	switch s.migStrategy {
	case "none", "single", "mixed":
	default:
		return fmt.Errorf("unknown MIG strategy: %v", s.migStrategy)
	}
	return nil
}

func (s settings) uses(strategy string) bool {
	for _, candidate := range s.deviceListStrategy {
		if candidate == strategy {
			return true
		}
	}
	return false
}

// initNvml: the pretend NVML, present only where the container runtime injected it.
func initNvml() ([]gpu, error) {
	data, err := os.ReadFile(nvmlPath)
	if err != nil {
		return nil, errNvmlUnavailable
	}
	var hw struct {
		GPUs []gpu `json:"gpus"`
	}
	if err := json.Unmarshal(data, &hw); err != nil {
		return nil, errNvmlUnavailable
	}
	return hw.GPUs, nil
}

// writeCDISpec describes each GPU as a CDI device of the kind the plugin's Allocate answers with.
func writeCDISpec(dir string, gpus []gpu) error {
	devices := make([]map[string]any, 0, len(gpus))
	for _, g := range gpus {
		devices = append(devices, map[string]any{
			"name": g.UUID,
			"containerEdits": map[string]any{
				"env": []string{
					"NVIDIA_VISIBLE_DEVICES=" + g.UUID,
					fmt.Sprintf("GPUFORGE_GPU_%d=%s (%s)", g.Index, g.UUID, g.Name),
				},
			},
		})
	}
	spec := map[string]any{"cdiVersion": "0.6.0", "kind": cdiKind, "devices": devices}
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	path := filepath.Join(dir, strings.ReplaceAll(cdiKind, "/", "-")+".json")
	if err := os.WriteFile(path+".tmp", data, 0o644); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	settings settings
	gpus     map[string]gpu // by UUID
	devices  []*pluginapi.Device
	resource string
}

func newPlugin(s settings, gpus []gpu) *plugin {
	p := &plugin{settings: s, gpus: map[string]gpu{}, resource: resourceName}
	// internal/rm/device_map.go updateDeviceMapWithReplicas: each GPU as `<uuid>::<n>` per replica.
	if s.replicas > 1 && s.renameByDefault {
		p.resource = resourceName + sharedSuffix
	}
	for _, g := range gpus {
		p.gpus[g.UUID] = g
		if s.replicas > 1 {
			for replica := 0; replica < s.replicas; replica++ {
				p.devices = append(p.devices, &pluginapi.Device{ID: fmt.Sprintf("%s::%d", g.UUID, replica), Health: pluginapi.Healthy})
			}
		} else {
			p.devices = append(p.devices, &pluginapi.Device{ID: g.UUID, Health: pluginapi.Healthy})
		}
	}
	return p
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

func (p *plugin) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

// deviceIDs: what the runtime is told, by --device-id-strategy (internal/plugin/server.go deviceIDsFromAnnotatedDeviceIDs).
func (p *plugin) deviceIDs(requested []string) []string {
	seen := map[string]bool{}
	var ids []string
	for _, id := range requested {
		uuid := strings.SplitN(id, "::", 2)[0]
		if seen[uuid] {
			continue
		}
		seen[uuid] = true
		if p.settings.deviceIDStrategy == "index" {
			ids = append(ids, strconv.Itoa(p.gpus[uuid].Index))
		} else {
			ids = append(ids, uuid)
		}
	}
	return ids
}

// Allocate answers as internal/plugin/server.go getAllocateResponse does for each list strategy.
func (p *plugin) Allocate(_ context.Context, request *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	response := &pluginapi.AllocateResponse{}
	for _, container := range request.ContainerRequests {
		for _, id := range container.DevicesIds {
			if _, ok := p.gpus[strings.SplitN(id, "::", 2)[0]]; !ok {
				return nil, fmt.Errorf("invalid allocation request for %q: unknown device: %s", p.resource, id)
			}
		}
		answer := &pluginapi.ContainerAllocateResponse{}
		ids := p.deviceIDs(container.DevicesIds)
		if p.settings.uses("envvar") {
			answer.Envs = map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(ids, ",")}
		}
		if p.settings.uses("volume-mounts") {
			for _, id := range ids {
				answer.Mounts = append(answer.Mounts, &pluginapi.Mount{
					HostPath: "/dev/null", ContainerPath: "/var/run/nvidia-container-devices/" + id,
				})
			}
		}
		var names []string
		for _, id := range p.deviceIDs(container.DevicesIds) {
			if p.settings.deviceIDStrategy == "index" {
				id = p.uuidOfIndex(id)
			}
			names = append(names, cdiKind+"="+id)
		}
		if p.settings.uses("cdi-annotations") {
			key := p.settings.cdiPrefix + "nvidia-device-plugin_" + strings.Join(ids, "-")
			answer.Annotations = map[string]string{key: strings.Join(names, ",")}
		}
		if p.settings.uses("cdi-cri") {
			for _, name := range names {
				answer.CdiDevices = append(answer.CdiDevices, &pluginapi.CDIDevice{Name: name})
			}
		}
		response.ContainerResponses = append(response.ContainerResponses, answer)
	}
	return response, nil
}

func (p *plugin) uuidOfIndex(index string) string {
	for uuid, g := range p.gpus {
		if strconv.Itoa(g.Index) == index {
			return uuid
		}
	}
	return index
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

func (p *plugin) GetPreferredAllocation(_ context.Context, request *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	response := &pluginapi.PreferredAllocationResponse{}
	for _, container := range request.ContainerRequests {
		chosen := append([]string{}, container.MustIncludeDeviceIDs...)
		available := append([]string{}, container.AvailableDeviceIDs...)
		sort.Strings(available)
		for _, id := range available {
			if len(chosen) >= int(container.AllocationSize) {
				break
			}
			if !contains(chosen, id) {
				chosen = append(chosen, id)
			}
		}
		response.ContainerResponses = append(response.ContainerResponses,
			&pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: chosen})
	}
	return response, nil
}

func contains(list []string, item string) bool {
	for _, candidate := range list {
		if candidate == item {
			return true
		}
	}
	return false
}

// serve starts the plugin's gRPC server and registers it with the kubelet (internal/plugin/server.go Start).
func (p *plugin) serve(pluginDir, kubeletSocket string) (*grpc.Server, error) {
	socket := filepath.Join(pluginDir, socketName)
	_ = os.Remove(socket)
	listener, err := net.Listen("unix", socket)
	if err != nil {
		return nil, err
	}
	server := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(server, p)
	go func() { _ = server.Serve(listener) }()
	conn, err := grpc.NewClient("unix://"+kubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		server.Stop()
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     socketName,
		ResourceName: p.resource,
		Options:      &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
	})
	if err != nil {
		server.Stop()
		return nil, err
	}
	fmt.Printf("Registered device plugin for '%s' with Kubelet\n", p.resource)
	return server, nil
}

func inode(path string) uint64 {
	info, err := os.Stat(path)
	if err != nil {
		return 0
	}
	if stat, ok := info.Sys().(*syscall.Stat_t); ok {
		return stat.Ino
	}
	return 0
}

func run(args []string) error {
	opts, err := parseOptions(args)
	if err != nil {
		return err
	}
	s, err := loadSettings(opts)
	if err != nil {
		// main.go startPlugins, called by start.
		return fmt.Errorf("error starting plugins: unable to load config: %v", err)
	}
	gpus, err := initNvml()
	if err != nil {
		// internal/rm/nvml_manager.go / main.go: with failOnInitError the plugin gives up on NVML;
		// without it, it serves nothing and waits.
		if s.failOnInitError {
			return fmt.Errorf("error starting plugins: error creating plugin manager: %v", err)
		}
		fmt.Printf("%v\nNo devices found. Waiting indefinitely.\n", err)
		return waitForSignal()
	}
	if err := s.validate(opts); err != nil {
		return fmt.Errorf("error starting plugins: unable to load config: unable to validate flags: %v", err)
	}
	if s.uses("cdi-annotations") || s.uses("cdi-cri") {
		// internal/cdi/cdi.go: the spec goes to /var/run/cdi, which the DaemonSet mounts from the host.
		if err := writeCDISpec("/var/run/cdi", gpus); err != nil {
			return fmt.Errorf("error starting plugins: unable to create cdi spec file: %v", err)
		}
	}
	config, _ := json.MarshalIndent(map[string]any{
		"migStrategy": s.migStrategy, "failOnInitError": s.failOnInitError,
		"deviceListStrategy": s.deviceListStrategy, "deviceIDStrategy": s.deviceIDStrategy,
		"replicas": s.replicas, "renameByDefault": s.renameByDefault,
	}, "", "  ")
	fmt.Printf("Running with config:\n%s\n", config)
	if len(gpus) == 0 {
		fmt.Println("No devices found. Waiting indefinitely.")
		return waitForSignal()
	}
	for _, g := range gpus {
		fmt.Printf("GPU %d %s %s\n", g.Index, g.UUID, g.Name)
	}
	p := newPlugin(s, gpus)
	pluginDir := filepath.Dir(s.kubeletSocket)
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGHUP)
	var server *grpc.Server
	var retry <-chan time.Time
	kubelet := uint64(0)
	start := func() {
		if server != nil {
			server.Stop()
			server = nil
		}
		kubelet = inode(s.kubeletSocket)
		server, err = p.serve(pluginDir, s.kubeletSocket)
		if err != nil {
			// main.go startPlugins: a plugin that cannot reach the kubelet is retried every 30 s.
			fmt.Printf("Could not contact Kubelet: %v\nFailed to start one or more plugins. Retrying in 30s...\n", err)
			retry = time.After(30 * time.Second)
		}
	}
	start()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-retry:
			start()
		case <-tick.C:
			// main.go start: a newly created kubelet.sock means the kubelet restarted; register again.
			if now := inode(s.kubeletSocket); now != 0 && now != kubelet {
				fmt.Printf("inotify: %s created, restarting.\n", s.kubeletSocket)
				start()
			}
		case sig := <-signals:
			if sig == syscall.SIGHUP {
				fmt.Println("Received SIGHUP, restarting.")
				start()
				continue
			}
			fmt.Printf("Received signal \"%v\", shutting down.\n", sig)
			if server != nil {
				server.Stop()
			}
			_ = os.Remove(filepath.Join(pluginDir, socketName))
			return nil
		}
	}
}

// waitForSignal blocks as the release does when it serves nothing, until it is told to stop.
func waitForSignal() error {
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGQUIT)
	<-signals
	return nil
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		// main.go: klog.Error(err); os.Exit(1).
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
