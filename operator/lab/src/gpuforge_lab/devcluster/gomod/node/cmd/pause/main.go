// Command pause holds a pod sandbox's namespaces open until it is told to stop: the node's sandbox image,
// built here because no registry is reachable.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	<-stop
}
