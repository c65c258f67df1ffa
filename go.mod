module github.com/agentenv/agentenv

go 1.26.8
