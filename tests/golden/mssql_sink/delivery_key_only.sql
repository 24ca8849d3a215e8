SET NOCOUNT ON;
SET XACT_ABORT ON;
DECLARE @stored bigint, @status int = 0;
BEGIN TRANSACTION;
SELECT @stored = [token] FROM [Sales Ünïcode].[sql_pseudo_trigger_fence] WITH (UPDLOCK, HOLDLOCK) WHERE [function] = @P1;
IF @stored > @P2 SET @status = 1;
IF @status = 0 AND @stored IS NULL INSERT INTO [Sales Ünïcode].[sql_pseudo_trigger_fence] ([function], [token], [updated_at]) VALUES (@P1, @P2, SYSUTCDATETIME());
IF @status = 0 AND @stored IS NOT NULL UPDATE [Sales Ünïcode].[sql_pseudo_trigger_fence] SET [token] = @P2, [updated_at] = SYSUTCDATETIME() WHERE [function] = @P1;
IF @status = 0
BEGIN
MERGE INTO [Sales Ünïcode].[Order]] Lines] WITH (HOLDLOCK) AS t USING OPENJSON(@P7) WITH ([Id] bigint N'$."Id"', [Line] int N'$."Line"') AS s ON t.[Id] = s.[Id] AND t.[Line] = s.[Line] WHEN NOT MATCHED THEN INSERT ([Id], [Line]) VALUES (s.[Id], s.[Line]);
END
IF @status = 1 ROLLBACK TRANSACTION; ELSE COMMIT TRANSACTION;
SELECT @status AS [status], @stored AS [stored];