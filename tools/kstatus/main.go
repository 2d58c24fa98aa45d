// kstatus prints the status sigs.k8s.io/cli-utils/pkg/kstatus computes for Kubernetes
// objects: the same judgement Flux's health checks make.
//
//	kubectl get topic orders -o json | kstatus
//	kubectl get topics -o json | kstatus      # a List: one line per item
//
// Each line is a JSON object: {"kind", "name", "status", "message"}; status is one of
// InProgress, Failed, Current, Terminating, NotFound, Unknown.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type line struct {
	Kind    string `json:"kind"`
	Name    string `json:"name"`
	Status  string `json:"status"`
	Message string `json:"message"`
}

func main() {
	data, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail(err)
	}
	obj := &unstructured.Unstructured{}
	if err := obj.UnmarshalJSON(data); err != nil {
		fail(fmt.Errorf("stdin is not a Kubernetes object: %w", err))
	}
	items := []unstructured.Unstructured{*obj}
	if obj.IsList() {
		list, err := obj.ToList()
		if err != nil {
			fail(err)
		}
		items = list.Items
	}
	out := json.NewEncoder(os.Stdout)
	for i := range items {
		res, err := status.Compute(&items[i])
		if err != nil {
			fail(fmt.Errorf("%s/%s: %w", items[i].GetKind(), items[i].GetName(), err))
		}
		if err := out.Encode(line{items[i].GetKind(), items[i].GetName(), res.Status.String(), res.Message}); err != nil {
			fail(err)
		}
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "kstatus:", err)
	os.Exit(2)
}
