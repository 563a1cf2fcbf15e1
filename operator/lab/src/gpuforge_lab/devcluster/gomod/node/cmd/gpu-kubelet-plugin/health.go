package main

import (
	"context"
	"net"
	"path/filepath"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// health answers the chart's gRPC probes (service "liveness") as cmd/gpu-kubelet-plugin/health.go does:
// serving only while the registration socket answers GetInfo and the DRA socket answers an empty
// NodePrepareResources, so a plugin whose sockets the kubelet can no longer reach gets restarted.
type health struct {
	healthpb.UnimplementedHealthServer
	registrarSocket string
	draSocket       string
}

func startHealth(ctx context.Context, flags *config, pluginDir string) (*grpc.Server, error) {
	listener, err := net.Listen("tcp", ":"+strconv.Itoa(flags.healthcheckPort))
	if err != nil {
		return nil, err
	}
	server := grpc.NewServer()
	healthpb.RegisterHealthServer(server, &health{
		registrarSocket: filepath.Join(flags.kubeletRegistrarDir, driverName+"-reg.sock"),
		draSocket:       filepath.Join(pluginDir, "dra.sock"),
	})
	go func() { _ = server.Serve(listener) }()
	return server, nil
}

func dial(socket string) (*grpc.ClientConn, error) {
	return grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

func (h *health) Check(ctx context.Context, request *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if request.Service != "" && request.Service != "liveness" {
		return nil, status.Errorf(codes.NotFound, "unknown service %q", request.Service)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	notServing := &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_NOT_SERVING}
	registrar, err := dial(h.registrarSocket)
	if err != nil {
		return notServing, nil
	}
	defer registrar.Close()
	info, err := registerapi.NewRegistrationClient(registrar).GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil || info.Name != driverName {
		return notServing, nil
	}
	dra, err := dial(h.draSocket)
	if err != nil {
		return notServing, nil
	}
	defer dra.Close()
	if _, err := drapb.NewDRAPluginClient(dra).NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{}); err != nil {
		return notServing, nil
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func (h *health) Watch(*healthpb.HealthCheckRequest, healthpb.Health_WatchServer) error {
	return status.Error(codes.Unimplemented, "watch is not served")
}
