// floorhook: an admission webhook that allows everything and does nothing else. It is not part of
// gpuforge: bench/bench_quota.py runs it as a reference, so that its figures show what the cheapest
// possible webhook costs on the same machine, under the same load generator, in the same run.
//
// Usage: floorhook ADDRESS CERT KEY
package main

import (
	"encoding/json"
	"net/http"
	"os"
)

type review struct {
	Request *struct {
		UID string `json:"uid"`
	} `json:"request"`
}

func main() {
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		var in review
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Request == nil {
			http.Error(w, "not an AdmissionReview", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"apiVersion": "admission.k8s.io/v1",
			"kind":       "AdmissionReview",
			"response":   map[string]any{"uid": in.Request.UID, "allowed": true},
		})
	})
	if err := http.ListenAndServeTLS(os.Args[1], os.Args[2], os.Args[3], nil); err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(1)
	}
}
