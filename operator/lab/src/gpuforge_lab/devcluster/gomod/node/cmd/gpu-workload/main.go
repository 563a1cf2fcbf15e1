// Command gpu-workload reports what a GPU container was given: the NVIDIA environment and the device
// nodes and files the container runtime injected from the CDI spec. Its log is what the tests read.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	env := os.Environ()
	sort.Strings(env)
	for _, entry := range env {
		if strings.HasPrefix(entry, "NVIDIA_") || strings.HasPrefix(entry, "GPUFORGE_") {
			fmt.Println("env", entry)
		}
	}
	devices, _ := filepath.Glob("/dev/nvidia*")
	sort.Strings(devices)
	for _, device := range devices {
		fmt.Println("device", device)
	}
	if data, err := os.ReadFile("/run/gpuforge/gpus.json"); err == nil {
		fmt.Printf("hardware %s\n", strings.Join(strings.Fields(string(data)), " "))
	}
	fmt.Println("done")
}
