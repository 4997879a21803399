package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/shuntnet/shunt/internal/atomicfile"
	"github.com/shuntnet/shunt/internal/proxyapi"
)

// save writes the configuration in force, whole or not at all.
func (p *Proxy) save(cfg proxyapi.Config) error {
	if p.configFile == "" {
		return nil
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	return atomicfile.Write(p.configFile, b)
}

// LoadConfigFile applies the configuration saved by the last proxy, so a
// restarted proxy serves before the agent pushes. No file is no error.
func (p *Proxy) LoadConfigFile() error {
	if p.configFile == "" {
		return nil
	}
	b, err := os.ReadFile(p.configFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var cfg proxyapi.Config
	if err := json.Unmarshal(b, &cfg); err != nil {
		return fmt.Errorf("reading %s: %w (the agent's next push replaces it)", p.configFile, err)
	}
	if err := p.Apply(cfg); err != nil {
		return fmt.Errorf("applying %s: %w", p.configFile, err)
	}
	return nil
}
