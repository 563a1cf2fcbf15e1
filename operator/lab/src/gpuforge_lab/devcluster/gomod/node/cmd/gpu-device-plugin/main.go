// Command gpu-device-plugin serves the kubelet's device-plugin API for pretend GPUs: the ones the host's
// simulated hardware file describes. Allocate answers with CDI device names, and the plugin writes the CDI
// spec that containerd resolves them with.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

const (
	resourceName = "nvidia.com/gpu"
	cdiKind      = "nvidia.com/gpu"
	endpoint     = "nvidia-gpu.sock"
)

type gpu struct {
	Index int    `json:"index"`
	Name  string `json:"name"`
	UUID  string `json:"uuid"`
}

type hardware struct {
	GPUs []gpu `json:"gpus"`
}

func env(name, fallback string) string {
	if value, ok := os.LookupEnv(name); ok {
		return value
	}
	return fallback
}

func loadHardware(path string) ([]gpu, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var hw hardware
	if err := json.Unmarshal(data, &hw); err != nil {
		return nil, err
	}
	return hw.GPUs, nil
}

// writeCDISpec describes each GPU as a CDI device that sets the variables a GPU container reads.
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
	path := filepath.Join(dir, "gpuforge-gpus.json")
	if err := os.WriteFile(path+".tmp", data, 0o644); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	gpus []gpu
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *plugin) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	devices := make([]*pluginapi.Device, 0, len(p.gpus))
	for _, g := range p.gpus {
		devices = append(devices, &pluginapi.Device{ID: g.UUID, Health: pluginapi.Healthy})
	}
	if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devices}); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func (p *plugin) Allocate(_ context.Context, request *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	response := &pluginapi.AllocateResponse{}
	for _, container := range request.ContainerRequests {
		answer := &pluginapi.ContainerAllocateResponse{}
		for _, id := range container.DevicesIds {
			answer.CdiDevices = append(answer.CdiDevices, &pluginapi.CDIDevice{Name: cdiKind + "=" + id})
		}
		response.ContainerResponses = append(response.ContainerResponses, answer)
	}
	return response, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

func (p *plugin) GetPreferredAllocation(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return &pluginapi.PreferredAllocationResponse{}, nil
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}

func main() {
	pluginDir := env("DEVICE_PLUGIN_PATH", pluginapi.DevicePluginPath)
	gpus, err := loadHardware(env("GPUFORGE_HARDWARE", "/var/lib/gpuforge-sim/gpus.json"))
	if err != nil || len(gpus) == 0 {
		if strings.EqualFold(env("FAIL_ON_INIT_ERROR", "true"), "true") {
			fail("failed to initialize NVML: no GPU hardware description (%v)", err)
		}
		fmt.Println("No devices found. Waiting indefinitely.")
		select {}
	}
	if err := writeCDISpec(env("CDI_ROOT", "/var/run/cdi"), gpus); err != nil {
		fail("writing the CDI spec: %v", err)
	}
	socket := filepath.Join(pluginDir, endpoint)
	_ = os.Remove(socket)
	listener, err := net.Listen("unix", socket)
	if err != nil {
		fail("listening on %s: %v", socket, err)
	}
	server := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(server, &plugin{gpus: gpus})
	go func() { _ = server.Serve(listener) }()

	conn, err := grpc.NewClient("unix://"+filepath.Join(pluginDir, "kubelet.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fail("connecting to the kubelet: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: endpoint, ResourceName: resourceName,
	})
	if err != nil {
		fail("registering with the kubelet: %v", err)
	}
	fmt.Printf("Registered %d GPUs as %s\n", len(gpus), resourceName)
	// A kubelet restart removes our socket: exit so the pod restarts and registers again.
	for {
		time.Sleep(2 * time.Second)
		if _, err := os.Stat(socket); err != nil {
			fail("socket %s removed: the kubelet restarted", socket)
		}
	}
}
