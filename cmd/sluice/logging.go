package main

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// driverLog routes the MySQL driver's own messages (broken connections during a database
// restart) into the process's JSON log, which would otherwise get plain "[mysql] ..." lines on
// stderr that a log pipeline cannot parse.
type driverLog struct{ log *slog.Logger }

// Print implements mysql.Logger.
func (d driverLog) Print(v ...any) {
	d.log.Warn("mysql driver", "detail", strings.TrimSpace(fmt.Sprint(v...)))
}

// useDriverLog installs log as the MySQL driver's logger. The driver keeps one logger per
// process, so this is wiring done once in main, never in a library.
func useDriverLog(log *slog.Logger) {
	_ = mysql.SetLogger(driverLog{log: log})
}
