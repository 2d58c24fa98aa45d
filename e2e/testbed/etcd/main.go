// Command etcd is upstream etcd's server entry point, built from its Go module.
//
// The etcd server module carries replace directives, so `go install` of it at a version
// fails; this wrapper module requires it like any library and calls the same entry point
// the upstream etcd binary does.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
