module github.com/xagent-connector/xagent-connector-rs/go

go 1.19
