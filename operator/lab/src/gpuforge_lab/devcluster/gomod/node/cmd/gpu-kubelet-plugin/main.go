// Command gpu-kubelet-plugin is a DRA kubelet plugin for driver gpu.nvidia.com serving pretend GPUs: the
// ones the host's simulated hardware file describes, read through the driver root the way NVIDIA's plugin
// reaches NVML. It runs on the kubelet's own helper (k8s.io/dynamic-resource-allocation/kubeletplugin):
// registration, ResourceSlice publishing and the NodePrepareResources/NodeUnprepareResources calls are
// the real thing; only the GPUs and their driver are not.
//
// Its flags, their environment variables and the ways it gives up follow NVIDIA's gpu-kubelet-plugin
// (NVIDIA/k8s-dra-driver-gpu v25.12.0, kubernetes-sigs/dra-driver-nvidia-gpu v0.4.0); see flags.go.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
)

const (
	driverName = "gpu.nvidia.com"
	// cmd/gpu-kubelet-plugin/cdi.go: CDI vendor "k8s." + driver name, class "device"; a device per
	// claim and GPU, named <claim UID>-<device>, so a name is never reused for another claim.
	cdiVendor = "k8s." + driverName
	cdiClass  = "device"
	// Where the chart mounts the host's driver root into the plugin (templates/kubeletplugin.yaml).
	containerDriverRoot = "/driver-root"
	// The lab's simulated hardware file, at this path on the host (and so under the driver root).
	hardwareFile = "var/lib/gpuforge-sim/gpus.json"
	// The imitation driver's nvidia-smi: the file the chart's prestart script waits for.
	driverProgram = "usr/bin/nvidia-smi"
)

type gpu struct {
	Index      int    `json:"index"`
	Name       string `json:"name"`
	UUID       string `json:"uuid"`
	MemoryMiB  int64  `json:"memory_mib"`
	ComputeCap string `json:"compute_cap"`
	PCIBusID   string `json:"pci_bus_id"`
	// From the driver and NVML, not the hardware file.
	Driver       string `json:"-"`
	CUDADriver   string `json:"-"`
	DeviceName   string `json:"-"`
	Architecture string `json:"-"`
	Brand        string `json:"-"`
}

// nvml stands in for NVIDIA's NVML: the GPUs and the driver's versions, found through the driver root.
// Without the driver (its nvidia-smi and the hardware it reports) NVML cannot load, and the plugin exits
// as NVIDIA's does (go-nvml Init: ERROR_LIBRARY_NOT_FOUND).
func nvml(driverRoot string) ([]gpu, error) {
	program, err := os.ReadFile(filepath.Join(driverRoot, driverProgram))
	if err != nil {
		return nil, errors.New("failed to initialize NVML: ERROR_LIBRARY_NOT_FOUND")
	}
	driver, cuda := stamped(string(program), "DRIVER_VERSION"), stamped(string(program), "CUDA_VERSION")
	data, err := os.ReadFile(filepath.Join(driverRoot, hardwareFile))
	if err != nil {
		return nil, errors.New("failed to initialize NVML: ERROR_LIBRARY_NOT_FOUND")
	}
	var hw struct {
		GPUs []gpu `json:"gpus"`
	}
	if err := json.Unmarshal(data, &hw); err != nil {
		return nil, fmt.Errorf("error enumerating GPUs: %w", err)
	}
	for i := range hw.GPUs {
		g := &hw.GPUs[i]
		g.Driver, g.CUDADriver = driver, cuda
		// deviceinfo.go CanonicalName: gpu-<minor>; the minor number is the index here.
		g.DeviceName = fmt.Sprintf("gpu-%d", g.Index)
		g.Architecture, g.Brand = architecture(g.ComputeCap), brand(g.Name)
	}
	return hw.GPUs, nil
}

// stamped reads a `NAME = "value"` line of the imitation driver's program (its build stamps).
func stamped(program, name string) string {
	for _, line := range strings.Split(program, "\n") {
		if rest, ok := strings.CutPrefix(line, name+" = "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`)
		}
	}
	return ""
}

// architecture: NVML's architecture names by compute capability major.minor.
func architecture(computeCap string) string {
	switch {
	case strings.HasPrefix(computeCap, "7.5"):
		return "Turing"
	case strings.HasPrefix(computeCap, "8.9"):
		return "Ada Lovelace"
	case strings.HasPrefix(computeCap, "8."):
		return "Ampere"
	case strings.HasPrefix(computeCap, "9."):
		return "Hopper"
	case strings.HasPrefix(computeCap, "10.") || strings.HasPrefix(computeCap, "12."):
		return "Blackwell"
	}
	return "Unknown"
}

// brand: NVML's brand (nvmlDeviceGetBrand): Tesla for the older data-centre boards, Nvidia after.
func brand(name string) string {
	if strings.HasPrefix(name, "Tesla") {
		return "Tesla"
	}
	return "Nvidia"
}

// semver: NVIDIA publishes versions as semver ("580.95.05" -> "580.95.5", "13.0" -> "13.0.0").
func semver(text string) string {
	parts := []string{}
	for _, part := range strings.Split(text, ".") {
		if n, err := strconv.Atoi(part); err == nil && len(parts) < 3 {
			parts = append(parts, strconv.Itoa(n))
		}
	}
	for len(parts) < 3 {
		parts = append(parts, "0")
	}
	return strings.Join(parts, ".")
}

func str(value string) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{StringValue: &value}
}
func ver(value string) resourceapi.DeviceAttribute {
	v := semver(value)
	return resourceapi.DeviceAttribute{VersionValue: &v}
}

// device: a full GPU as deviceinfo.go GpuInfo.GetDevice publishes it (v25.12: the standard pciBusID).
func device(g gpu) resourceapi.Device {
	return resourceapi.Device{
		Name: g.DeviceName,
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type":                            str("gpu"),
			"uuid":                            str(g.UUID),
			"productName":                     str(g.Name),
			"brand":                           str(g.Brand),
			"architecture":                    str(g.Architecture),
			"cudaComputeCapability":           ver(g.ComputeCap),
			"driverVersion":                   ver(g.Driver),
			"cudaDriverVersion":               ver(g.CUDADriver),
			"resource.kubernetes.io/pciBusID": str(g.PCIBusID),
		},
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			"memory": {Value: *resource.NewQuantity(g.MemoryMiB*1024*1024, resource.BinarySI)},
		},
	}
}

type driver struct {
	nodeName string
	cdiRoot  string
	gpus     map[string]gpu
	mu       sync.Mutex
	cancel   context.CancelCauseFunc
}

func (d *driver) specPath(claim types.UID) string {
	return filepath.Join(d.cdiRoot, fmt.Sprintf("%s-%s_%s.json", cdiVendor, cdiClass, claim))
}

func (d *driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	result := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		result[claim.UID] = d.prepare(claim)
	}
	return result, nil
}

func (d *driver) prepare(claim *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	if claim.Status.Allocation == nil {
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)}
	}
	var prepared []kubeletplugin.Device
	var devices []map[string]any
	for _, result := range claim.Status.Allocation.Devices.Results {
		if result.Driver != driverName {
			continue
		}
		if result.Pool != d.nodeName {
			return kubeletplugin.PrepareResult{Err: fmt.Errorf("device %s of pool %s is not on node %s", result.Device, result.Pool, d.nodeName)}
		}
		g, ok := d.gpus[result.Device]
		if !ok {
			return kubeletplugin.PrepareResult{Err: fmt.Errorf("no GPU %s on this node", result.Device)}
		}
		name := fmt.Sprintf("%s-%s", claim.UID, g.DeviceName)
		devices = append(devices, map[string]any{
			"name": name,
			"containerEdits": map[string]any{
				"env": []string{
					fmt.Sprintf("GPUFORGE_GPU_%d=%s (%s)", g.Index, g.UUID, g.Name),
					fmt.Sprintf("GPUFORGE_DRA_CLAIM=%s/%s", claim.Namespace, claim.Name),
				},
			},
		})
		prepared = append(prepared, kubeletplugin.Device{
			Requests:     []string{result.Request},
			PoolName:     result.Pool,
			DeviceName:   result.Device,
			CDIDeviceIDs: []string{fmt.Sprintf("%s/%s=%s", cdiVendor, cdiClass, name)},
		})
	}
	spec := map[string]any{"cdiVersion": "0.6.0", "kind": cdiVendor + "/" + cdiClass, "devices": devices}
	if err := writeAtomically(d.specPath(claim.UID), spec); err != nil {
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("writing the CDI spec: %w", err)}
	}
	return kubeletplugin.PrepareResult{Devices: prepared}
}

func writeAtomically(path string, content any) error {
	data, err := json.MarshalIndent(content, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(path+".tmp", data, 0o644); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

func (d *driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	result := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		err := os.Remove(d.specPath(claim.UID))
		if errors.Is(err, os.ErrNotExist) {
			err = nil // idempotent: the kubelet may ask again after a restart
		}
		result[claim.UID] = err
	}
	return result, nil
}

// HandleError: background errors (publishing slices). Fatal ones end the process so the pod restarts,
// as the helper's documentation asks.
func (d *driver) HandleError(ctx context.Context, err error, msg string) {
	runtime.HandleErrorWithContext(ctx, err, msg)
	if !errors.Is(err, kubeletplugin.ErrRecoverable) {
		d.cancel(fmt.Errorf("fatal background error: %w", err))
	}
}

func kubeClient(kubeconfig string) (kubernetes.Interface, error) {
	var config *rest.Config
	var err error
	if kubeconfig != "" {
		config, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		config, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("create client configuration: %w", err)
	}
	return kubernetes.NewForConfig(config)
}

func main() {
	flags, err := parseFlags(os.Args[1:], os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
	if err := run(flags); err != nil {
		klog.ErrorS(err, "gpu-kubelet-plugin exits")
		klog.Flush()
		os.Exit(1)
	}
}

func run(flags *config) error {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	go func() { <-signals; cancel(errors.New("signalled")) }()

	gpus, err := nvml(containerDriverRoot)
	if err != nil {
		return err
	}
	client, err := kubeClient(flags.kubeconfig)
	if err != nil {
		return err
	}
	d := &driver{nodeName: flags.nodeName, cdiRoot: flags.cdiRoot, gpus: map[string]gpu{}, cancel: cancel}
	devices := make([]resourceapi.Device, 0, len(gpus))
	sort.Slice(gpus, func(i, j int) bool { return gpus[i].Index < gpus[j].Index })
	for _, g := range gpus {
		d.gpus[g.DeviceName] = g
		devices = append(devices, device(g))
	}
	if err := os.MkdirAll(flags.cdiRoot, 0o755); err != nil {
		return fmt.Errorf("create the CDI root %s: %w", flags.cdiRoot, err)
	}
	pluginDir := filepath.Join(flags.kubeletPluginsDir, driverName)
	if err := os.MkdirAll(pluginDir, 0o750); err != nil {
		return fmt.Errorf("create the plugin directory %s: %w", pluginDir, err)
	}
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(flags.nodeName),
		kubeletplugin.DriverName(driverName),
		kubeletplugin.RegistrarDirectoryPath(flags.kubeletRegistrarDir),
		kubeletplugin.PluginDataDirectoryPath(pluginDir),
	)
	if err != nil {
		return fmt.Errorf("start the kubelet plugin: %w", err)
	}
	defer helper.Stop()
	// One pool per node, named after it, as NVIDIA's plugin publishes (driver.go).
	resources := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		flags.nodeName: {Slices: []resourceslice.Slice{{Devices: devices}}},
	}}
	if err := helper.PublishResources(ctx, resources); err != nil {
		return fmt.Errorf("publish resources: %w", err)
	}
	klog.InfoS("publishing GPUs", "driver", driverName, "node", flags.nodeName, "devices", len(devices))
	if flags.healthcheckPort >= 0 {
		health, err := startHealth(ctx, flags, pluginDir)
		if err != nil {
			return fmt.Errorf("start the health server: %w", err)
		}
		defer health.Stop()
	}
	<-ctx.Done()
	if cause := context.Cause(ctx); cause != nil && cause.Error() != "signalled" {
		return cause
	}
	return nil
}
