// Command shunt-install-cni puts shunt's CNI plugin on a node: it copies
// shunt-cni into the node's CNI binary directory and writes the network
// configuration the container runtime reads, each atomically (a temporary
// file renamed over the old one, internal/atomicfile), so a runtime never
// runs half a binary or reads half a configuration. With --uninstall it removes both. The Helm
// chart's init container runs it; the image has no shell to do it with.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/shuntnet/shunt/internal/atomicfile"
)

func main() {
	var o options
	flag.StringVar(&o.pluginSrc, "plugin", "/usr/local/bin/shunt-cni", "the shunt-cni binary to install")
	flag.StringVar(&o.binDir, "cni-bin-dir", "/host/opt/cni/bin", "the node's CNI binary directory (as mounted)")
	flag.StringVar(&o.confDir, "cni-conf-dir", "/host/etc/cni/net.d", "the node's CNI configuration directory (as mounted)")
	flag.StringVar(&o.confName, "conf-name", "10-shunt.conflist", "file name of the network configuration")
	flag.StringVar(&o.conf, "conf", `{"cniVersion":"1.1.0","name":"shunt","plugins":[{"type":"shunt-cni","capabilities":{"cgroupPath":true}}]}`, "the network configuration list (JSON)")
	flag.BoolVar(&o.uninstall, "uninstall", false, "remove the plugin and the configuration instead")
	flag.Parse()
	if err := o.run(); err != nil {
		fmt.Fprintln(os.Stderr, "shunt-install-cni:", err)
		os.Exit(1)
	}
}

type options struct {
	pluginSrc, binDir, confDir, confName, conf string
	uninstall                                  bool
}

func (o options) run() error {
	plugin := filepath.Join(o.binDir, filepath.Base(o.pluginSrc))
	conf := filepath.Join(o.confDir, o.confName)
	if o.uninstall {
		// The configuration first: once it is gone the runtime sends no
		// new pod to the plugin.
		for _, p := range []string{conf, plugin} {
			if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
				return err
			}
			fmt.Printf("removed %s\n", p)
		}
		return nil
	}
	var list struct {
		CNIVersion string            `json:"cniVersion"`
		Name       string            `json:"name"`
		Plugins    []json.RawMessage `json:"plugins"`
	}
	if err := json.Unmarshal([]byte(o.conf), &list); err != nil || list.CNIVersion == "" || list.Name == "" || len(list.Plugins) == 0 {
		return fmt.Errorf("--conf is not a CNI network configuration list (cniVersion, name and plugins): %v", err)
	}
	bin, err := os.ReadFile(o.pluginSrc)
	if err != nil {
		return fmt.Errorf("the plugin to install: %w", err)
	}
	// The binary before the configuration that names it. Each through a
	// temporary file renamed over the old one: a runtime sees the old file
	// or the new one, and a plugin running while it is replaced keeps its
	// inode ("text file busy" never happens).
	if err := install(plugin, bin, 0o755); err != nil {
		return err
	}
	fmt.Printf("installed %s\n", plugin)
	pretty, _ := json.MarshalIndent(json.RawMessage(o.conf), "", "  ")
	if err := install(conf, append(pretty, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Printf("wrote %s\n", conf)
	return nil
}

func install(path string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("%s: %w (is the node's directory mounted?)", filepath.Dir(path), err)
	}
	return atomicfile.WriteMode(path, data, mode)
}
