// CoreDNS with only the plugins the test bed's cluster DNS uses (the Corefile in
// e2e/testbed/clusterdns.py): the kubernetes plugin answers <svc>.<ns>.svc.cluster.local
// from the API server. Upstream's main imports every plugin (and every cloud SDK with
// them); a plugin registers itself when its package is imported, so this one imports
// the few it needs and runs the same coremain.
package main

import (
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"

	"github.com/coredns/coredns/coremain"
)

func main() {
	coremain.Run()
}
