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

// useDriverLog installs log as the MySQL driver's logger and as the default logger of log/slog,
// which the standard log package then writes through: http.Server's own errors and any
// library's log.Print go into the process's log queue, never straight to stderr, where a sink
// that stopped reading would block them (SPEC §10). Both are one per process, so this is wiring
// done once in main, never in a library.
func useDriverLog(log *slog.Logger) {
	_ = mysql.SetLogger(driverLog{log: log})
	slog.SetDefault(log)
}
