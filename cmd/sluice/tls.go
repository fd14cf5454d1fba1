package main

import (
	"context"
	"database/sql"
	"errors"

	"github.com/sluicehq/sluice/gate/store"
)

// mysqlDSN is the MySQL DSN setting with the TLS files of SLUICE_MYSQL_CA, SLUICE_MYSQL_CERT
// and SLUICE_MYSQL_KEY applied (store.WithTLS): what every command that opens the database
// passes to store.Open.
func (c *settingValues) mysqlDSN() (string, error) {
	return store.WithTLS(c.get("mysql-dsn"), store.TLSFiles{CA: c.get("mysql-ca"), Cert: c.get("mysql-cert"), Key: c.get("mysql-key")})
}

// openDB opens the database of the settings (store.Open), over TLS when they say so.
func (c *settingValues) openDB(ctx context.Context) (*sql.DB, error) {
	dsn, err := c.mysqlDSN()
	if err != nil {
		return nil, err
	}
	return store.Open(ctx, dsn)
}

// errDevTLS refuses the listeners' TLS settings under `sluice dev`: its simulated executor
// calls the API back over http:// on loopback, and a development process has no certificate
// to serve anyway.
var errDevTLS = errors.New("SLUICE_TLS_CERT and SLUICE_TLS_KEY are for `sluice serve`: `sluice dev` serves plain HTTP on loopback, which its simulated executor calls back")
