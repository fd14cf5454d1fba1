package main

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// TestSettingsPrecedence: a flag beats the environment, which beats the config file, which beats
// the default; an environment variable or a file line that is set but empty counts as unset,
// while a flag given empty is still the operator's explicit choice.
func TestSettingsPrecedence(t *testing.T) {
	file := filepath.Join(t.TempDir(), "sluice.env")
	if err := os.WriteFile(file, []byte("SLUICE_MYSQL_DSN=file-dsn\nSLUICE_LISTEN=\nSLUICE_LOG_LEVEL=warn\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		env   map[string]string // set with t.Setenv; "" sets the variable empty
		args  []string
		key   string
		want  string
		isSet bool
	}{
		{"flag beats environment", map[string]string{"SLUICE_MYSQL_DSN": "env-dsn"}, []string{"--mysql-dsn", "flag-dsn"}, "mysql-dsn", "flag-dsn", true},
		{"environment beats file", map[string]string{"SLUICE_MYSQL_DSN": "env-dsn"}, nil, "mysql-dsn", "env-dsn", true},
		{"file beats default", nil, nil, "mysql-dsn", "file-dsn", true},
		{"default", nil, nil, "subject-prefix", "sluice", false},
		{"empty environment falls to the file", map[string]string{"SLUICE_MYSQL_DSN": ""}, nil, "mysql-dsn", "file-dsn", true},
		{"empty environment falls to the default", map[string]string{"SLUICE_SIMEXEC_LISTEN": ""}, nil, "simexec-listen", "127.0.0.1:7481", false},
		{"empty environment bool falls to the default", map[string]string{"SLUICE_EXECUTOR_CONFIRM_START": ""}, nil, "executor-confirm-start", "true", false},
		{"empty file line falls to the default", nil, nil, "listen", "127.0.0.1:7480", false},
		{"empty environment does not hide the file", map[string]string{"SLUICE_LOG_LEVEL": ""}, nil, "log-level", "warn", true},
		{"empty flag is explicit", map[string]string{"SLUICE_MYSQL_DSN": "env-dsn"}, []string{"--mysql-dsn="}, "mysql-dsn", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Every setting the cases read starts unset, whatever the developer's shell holds.
			unsetSettings(t, false)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			c, err := parseSettings(fs, append([]string{"--config", file}, tc.args...))
			if err != nil {
				t.Fatal(err)
			}
			if got := c.get(tc.key); got != tc.want {
				t.Errorf("%s = %q, want %q", tc.key, got, tc.want)
			}
			if c.set[tc.key] != tc.isSet {
				t.Errorf("%s counted as set: %v, want %v", tc.key, c.set[tc.key], tc.isSet)
			}
		})
	}
}

// unsetEnv removes key from the environment for the rest of tb; Setenv's cleanup restores it.
// unsetSettings unsets every setting's environment variable for tb, and SLUICE_CONFIG too with
// config, so that a test sees only what it sets.
func unsetSettings(tb testing.TB, config bool) {
	tb.Helper()
	for _, s := range settings {
		unsetEnv(tb, s.env)
	}
	if config {
		unsetEnv(tb, "SLUICE_CONFIG")
	}
}

func unsetEnv(tb testing.TB, key string) {
	tb.Helper()
	tb.Setenv(key, "")
	os.Unsetenv(key)
}
