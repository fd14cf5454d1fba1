package gate

import "testing"

func TestNewCompleterChecksPrefix(t *testing.T) {
	for _, prefix := range []string{"a b", "sluice.*", "x.>", ".x", "x."} {
		if _, err := NewCompleter(CompleterConfig{Prefix: prefix}); err == nil {
			t.Errorf("NewCompleter(prefix %q) accepted an invalid prefix", prefix)
		}
	}
	if _, err := NewCompleter(CompleterConfig{Prefix: "acme.sluice"}); err != nil {
		t.Errorf("NewCompleter(acme.sluice) = %v", err)
	}
}
